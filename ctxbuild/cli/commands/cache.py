"""`ctxbuild cache stats|gc|clear`: look after the local cache (ccache's -s / --evict / -C)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ctxbuild.cli import options
from ctxbuild.cli.parser import Command, Parser
from ctxbuild.errors import UsageError
from ctxbuild.layout import cache_dir
from ctxbuild.atomic import read_json
from ctxbuild.units import fmt_size, parse_size

SUMMARY = "last_build.json"  # the driver's summary of the most recent build that used this cache


def resolve_dir(given: Path | None) -> Path:
    return given.expanduser().resolve() if given else cache_dir()


def arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cache_cmd", required=True, parser_class=Parser)
    stats = sub.add_parser("stats", help="entries, size, and the last build's hits and misses")
    stats.add_argument("--json", action="store_true", help="print JSON instead of text")
    gc = sub.add_parser("gc", help="evict least recently used entries down to a size")
    gc.add_argument("--max-size", required=True, metavar="SIZE", help="e.g. 500M, 2G, 1GiB or a byte count")
    clear = sub.add_parser("clear", help="remove every entry")
    for c in (stats, gc, clear):
        options.cache_dir(c)


def run(args: argparse.Namespace) -> int:
    from ctxbuild.cache import LocalStore
    from ctxbuild.cache.local import GRACE_SECONDS

    root = resolve_dir(args.cache_dir)
    store = LocalStore(root)
    if args.cache_cmd == "stats":
        return _stats(store, args.json)
    if args.cache_cmd == "gc":
        limit = parse_size(args.max_size)
        before = store.stats() if root.is_dir() else {"entries": 0, "blobs": 0, "bytes": 0}
        result = store.gc(limit) if root.is_dir() else {"removed_entries": 0, "removed_blobs": 0, "bytes": 0}
        freed = before["bytes"] - result["bytes"]
        print(f"removed {result['removed_entries']} entries and {result['removed_blobs']} blobs "
              f"({fmt_size(max(freed, 0))}), least recently used first; {root} now holds {fmt_size(result['bytes'])} "
              f"(limit {fmt_size(limit)})")
        if result["bytes"] > limit:
            print(f"note: some blobs no entry names were kept: written too recently (unreferenced ones: within "
                  f"{GRACE_SECONDS / 60:.0f} minutes), a build may be about to name them; `ctxbuild cache clear` "
                  "removes everything")
        return 0
    if args.cache_cmd == "clear":
        before = store.stats() if root.is_dir() else {"entries": 0, "blobs": 0, "bytes": 0}
        if root.is_dir():
            store.clear()
            (root / SUMMARY).unlink(missing_ok=True)
        print(f"removed {before['entries']} entries and {before['blobs']} blobs ({fmt_size(before['bytes'])}) "
              f"from {root}")
        return 0
    raise UsageError(f"unknown cache command {args.cache_cmd}")


def _stats(store: Any, as_json: bool) -> int:
    root: Path = store.root
    stats = store.stats() if root.is_dir() else {"entries": 0, "blobs": 0, "bytes": 0, "last_gc": None}
    last = read_json(root / SUMMARY)
    last = last if isinstance(last, dict) else None
    info = {"cache_dir": str(root), **stats, "last_build": last}
    if as_json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    print(f"cache directory   {root}")
    print(f"entries           {stats['entries']}")
    print(f"blobs             {stats['blobs']}")
    print(f"size              {fmt_size(stats['bytes'])} ({stats['bytes']} bytes)")
    if last is None:
        print("last build        none recorded (no-op builds are not)")
        return 0
    looked = last.get("hits", 0) + last.get("misses", 0)
    rate = f" ({100 * last.get('hits', 0) / looked:.0f}% hits)" if looked else ""
    print(f"last build        {last.get('out', '?')}: {last.get('ran', 0)} actions ran or restored, "
          f"{last.get('hits', 0)} hits{rate} ({last.get('hits_local', 0)} local, "
          f"{last.get('hits_remote', 0)} remote), {last.get('misses', 0)} misses, {last.get('failed', 0)} failed")
    sys.stdout.flush()
    return 0



COMMAND = Command("cache", "local cache: stats, gc, clear", arguments, run)
