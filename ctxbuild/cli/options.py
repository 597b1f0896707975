"""Options several commands share (recipe paths and OUT, -j, the cache and executor flags), the argument types
that check counts and sizes, and what those flags become: the cache environment and the console."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctxbuild.engine.console import Console


def count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum` (a negative -j reached ninja, a --compile-jobs of -2 an
    invalid build.ninja)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    parse.__name__ = "count"
    return parse


def out_dir(text: str) -> Path:
    """An argparse type: OUT, which must not be an existing file (a usage error, exit 2, not a failed build)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not an output directory")
    return path


def size(text: str | None, flag: str) -> int | None:
    from ctxbuild.units import parse_size

    return None if text is None else parse_size(text, flag)


def paths_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", type=Path, default=[Path("recipes")], metavar="PATHS",
                   help="recipe files or directories (searched for *.yaml; default: recipes)")
    p.add_argument("-o", "--out", type=out_dir, default=Path("out"), help="output directory (default: out)")


def recipe_args(args: argparse.Namespace) -> tuple[str, ...]:
    """-C, PATHS and -o as this command line gave them (defaults left out), shell-quoted: what a command a hint
    tells the user to run needs to find the same recipes and OUT."""
    import shlex

    given = (["-C", str(args.directory)] if args.directory is not None else []) + (
        [] if args.paths == [Path("recipes")] else [str(p) for p in args.paths]) + (
        [] if args.out == Path("out") else ["-o", str(args.out)])
    return tuple(shlex.quote(a) for a in given)


def jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("-j", "--jobs", type=count(0), help="parallel actions (0: no limit; default: make's jobserver, "
                   "else ninja's, about CPUs + 2)")


def cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-cache", action="store_true", help="bypass the action cache")
    cache_dir(p)
    p.add_argument("--remote-cache", metavar="URL", help="HTTP cache with /ac and /cas (default: $CTXBUILD_REMOTE_CACHE, "
                   "else cache.remote in _defaults.yaml, else none)")
    p.add_argument("--remote-read-only", action="store_true", help="never upload (untrusted builds)")
    p.add_argument("--remote-max-download", metavar="SIZE", help="the most one remote blob download may bring, "
                   "e.g. 64G (default 32GiB; or cache.max_download)")


def cache_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", type=Path, help="local cache (default: $CTXBUILD_CACHE_DIR or XDG cache)")


def executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", metavar="ADDRESS",
                   help="run actions on a Dask cluster, e.g. tcp://host:8786 (or $CTXBUILD_EXECUTOR; default: local)")
    p.add_argument("--executor-fallback", choices=["fail", "local"],
                   help="if the cluster is unreachable: fail (default) or build locally ($CTXBUILD_EXECUTOR_FALLBACK)")


def cache_env(args: argparse.Namespace) -> dict[str, str]:
    """Cache settings reach ninja's action processes through the environment (not build.ninja: no rebuilds)."""
    env: dict[str, str] = {}
    if args.no_cache:
        env["CTXBUILD_NO_CACHE"] = "1"
    if args.cache_dir:
        env["CTXBUILD_CACHE_DIR"] = str(args.cache_dir.resolve())
    if args.remote_cache:
        env["CTXBUILD_REMOTE_CACHE"] = args.remote_cache
    if args.remote_read_only:
        env["CTXBUILD_REMOTE_READ_ONLY"] = "1"
    if args.remote_max_download:
        env["CTXBUILD_REMOTE_MAX_DOWNLOAD"] = str(size(args.remote_max_download, "--remote-max-download"))
    return env


def console(args: argparse.Namespace) -> Console:
    from ctxbuild.engine.console import Console

    return Console(quiet=bool(args.quiet), verbose=bool(args.verbose), json=bool(getattr(args, "json", False)))
