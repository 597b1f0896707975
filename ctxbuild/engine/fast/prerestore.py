"""Restore pending actions from the cache before ninja starts, in this one process, in parallel.

Bazel checks its action cache this way. Run through ninja, every restored action would cost a client
process, the worker's start (~0.5 s of imports) and a fork: ~25-110 ms each. Here: ninja's dry run names the
edges it would run; in dependency order (waves), every one whose inputs are settled (sources, or outputs
restored in an earlier wave) is keyed exactly as the runner keys it, looked up, and restored with every
byte checked, then gets the record the runner would have written and the build-log entry ninja would have
written (ninjalog.py), so ninja finds it up to date. What misses, and everything downstream of it, is left
to ninja; the first miss starts the worker so it imports while the rest is restored.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxbuild.plan import actionkey, kinds
from ctxbuild.engine import ninjalog
from ctxbuild.digests import canonical_json
from ctxbuild.plan.action import load_spec
from ctxbuild import settings
from ctxbuild.cache.backends import open_cache
from ctxbuild.atomic import read_json, write_bytes
from ctxbuild.digests import DigestMemo
from ctxbuild.layout import STATE, log_path, record_path, rel, spec_name
from ctxbuild.verify import gates

# I/O and hashing release the GIL, the keying around them does not: more threads than cores mostly trade the
# GIL back and forth (2 cores, 150 actions: median 0.65 s with 2 threads, 0.97 s with 4, 1.0 s with 8).
THREADS = min(8, os.cpu_count() or 2)


@dataclass
class Restored:
    description: str
    wrote: bool  # an output was (re)placed
    ran: bool  # counts as run in this build (a new record); False: what ninja's restat would have skipped
    needed: bool  # False: a precision-search candidate's placeholders (its gate closed): not shown, not counted


def restore_pending(out: Path, plan: dict[str, Any], commands: list[str], build_id: str,
                    on_miss: Callable[[], None], say: Callable[[str], None] = print) -> bool:
    """Restore what can be restored of `commands` (ninja -n -v, in order). `on_miss` is called as soon as
    something is known to be left for ninja to run. True: nothing is (ninja would find all up to date).
    `say`: where progress lines go (the build's console)."""
    marker = f" {STATE}/actions/"
    by_spec = {spec_name(a["id"]): a for a in plan["actions"]}
    pending: dict[str, str] = {}  # action id -> its command as ninja evaluates it
    for cmd in commands:
        a = by_spec.get(cmd.rpartition(marker)[2]) if marker in cmd else None
        if a is None:  # not an action edge (the generator): let ninja do everything
            on_miss()
            return False
        pending[a["id"]] = cmd
    if not pending or settings.NO_CACHE.get():
        if pending:
            on_miss()
        return not pending
    from ctxbuild.engine.run import runner  # the action kinds' hooks; imported here, not in each thread

    deps = {a["id"]: [d for d in a["deps"] if d in pending] for a in plan["actions"] if a["id"] in pending}
    restorer = _Restorer(out, build_id, runner)
    done: dict[str, bool] = {}  # restored action id -> it wrote an output (downstream sees a new mtime)
    restored: list[str] = []
    n, t0 = len(pending), time.monotonic()
    shown = n  # pending actions less the placeholders met so far
    with ThreadPoolExecutor(THREADS) as pool:
        for wave in _waves(deps):
            todo = [a for a in wave if all(d in done for d in deps[a])]
            if not todo:
                continue
            # ninja's restat time for this wave: after the last wave's outputs were placed, before any key.
            stamp = ninjalog.fs_now(out / STATE)
            # ninja runs an edge pending for its own sake (no pending inputs: a touched input, a missing output);
            # one pending only downstream of others runs only if one of those rewrote an output (restat).
            results = pool.map(lambda a: restorer.restore(a, pending[a], stamp,
                                                          not deps[a] or any(done[d] for d in deps[a])), todo)
            for aid, result in zip(todo, results):
                if result is None:
                    on_miss()
                    continue
                done[aid] = result.wrote
                if not result.needed:
                    shown -= 1
                elif result.ran:
                    restored.append(aid)
                    say(f"[restored {len(restored)}/{shown}] {result.description}")
    for w in restorer.warnings:
        print(f"ctxbuild: warning: {w}", file=sys.stderr)
    logged = bool(done) and ninjalog.append(out / STATE, restorer.log_entries)
    if done:
        if not logged:
            on_miss()  # ninja will run them again (each a cache hit): slower, still right
        say(f"ctxbuild: restored {len(restored)} of {shown} pending actions from the cache "
            f"in {time.monotonic() - t0:.2f} s")
    return logged and len(done) == n


def _waves(deps: dict[str, list[str]]) -> list[list[str]]:
    """Actions grouped so that each one's pending dependencies are in earlier groups."""
    level: dict[str, int] = {}

    def depth(a: str) -> int:
        if a not in level:
            level[a] = 1 + max((depth(d) for d in deps[a]), default=-1)
        return level[a]

    waves: list[list[str]] = []
    for a in sorted(deps, key=depth):
        while len(waves) <= level[a]:
            waves.append([])
        waves[level[a]].append(a)
    return waves


class _Restorer:
    """One action's lookup and restore, as the runner would do it on a hit; thread-safe."""

    def __init__(self, out: Path, build_id: str, runner: Any) -> None:
        self.out = out
        self.build_id = build_id
        self.runner = runner
        self.log_entries: list[tuple[int, int, int, str, str]] = []
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._t0 = time.monotonic()

    def restore(self, aid: str, command: str, stamp: int, runs: bool) -> Restored | None:
        """None if the action must run (a miss, or anything unexpected: ninja then runs it and reports
        whatever is wrong the usual way)."""
        try:
            return self._restore(aid, command, stamp, runs)
        except Exception:  # noqa: BLE001 - see above
            return None

    def _restore(self, aid: str, command: str, stamp: int, runs: bool) -> Restored | None:
        """`runs`: ninja would run this edge; else it counts as run only if the restore changes something."""
        runner, out = self.runner, self.out
        t = time.monotonic()
        action = load_spec(out / STATE / "actions" / spec_name(aid))
        memo = self._memo()
        cache = open_cache()
        key, components = runner.action_key(action, out, memo, actionkey.discover(action, memo))
        hit = cache.lookup(key)
        outputs = {r: Path(p) for r, p in action.outputs.items()}
        before = [_identity(p) for p in outputs.values()]
        if hit is None or not cache.restore(hit, outputs) or not self._checked(action, cache):
            if cache.warnings:  # e.g. a corrupt blob, now deleted: the runner's record must still say so
                runner.carried_warnings(out, aid, self.build_id, cache.warnings)
            return None
        previous = read_json(record_path(out, aid))
        wrote = before != [_identity(p) for p in outputs.values()]
        ran = (runs or wrote or previous is None or previous.get("key") != key
               or previous.get("status") != "ok")
        shown = self._write_record(action, key, components, cache, hit, memo, previous, t) if ran else []
        ms = lambda x: int((x - self._t0) * 1000)  # noqa: E731
        with self._lock:
            self.warnings += [w for w in shown if w not in self.warnings]
            self.log_entries += [(ms(t), ms(time.monotonic()), stamp, rel(str(p), out), command)
                                 for p in outputs.values()]
        return Restored(action.description, wrote, ran, not gates.closed(action.inputs))

    def _checked(self, action: Any, cache: Any) -> bool:
        """The kind's check_outputs hook on the restored outputs, as the runner applies it (the binary's SoC
        read back: a poisoned or wrong-SoC entry is a miss). A rejected entry's outputs are removed and ninja
        runs the action; the runner meets the entry again and says so, so its warning is not carried."""
        kind = kinds.get(action.kind)
        if kind.hook("check_outputs") is kinds.HOOK_DEFAULTS["check_outputs"]:
            return True
        return self.runner.restored_ok(action, kind, _Scratch())

    def _memo(self) -> DigestMemo:
        """One digest memo per thread (sqlite connections belong to their thread; opening and closing one per
        action costs ~4 ms here). Each closes when its thread ends and its thread-local storage goes."""
        memo = getattr(self._local, "memo", None)
        if memo is None:
            memo = self._local.memo = DigestMemo(self.out / STATE / "digests.sqlite")
        return memo

    def _write_record(self, action: Any, key: str, components: dict[str, Any], cache: Any, hit: Any,
                      memo: DigestMemo, previous: dict[str, Any] | None, t: float) -> list[str]:
        """Write the record and log the runner would have written for this hit; returns its warnings."""
        runner, out, aid = self.runner, self.out, action.id
        record = runner.new_record(action, self.build_id)
        runner.note_key(record, key, components, previous)
        record["source"] = "cache"
        record["cache_origin"] = "remote" if cache.hits_remote else "local"
        record["original_seconds"] = hit.meta.get("seconds")  # what the work cost when it ran
        shown = runner.complete_record(action, out, record, hit, memo, cache)
        log = log_path(out, aid)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(runner.restored_log(action, key, cache, hit))  # as the runner's captured log: not atomic
        record["seconds"] = round(time.monotonic() - t, 3)
        record["finished"] = time.time()
        record["log"] = str(log.relative_to(out))
        write_bytes(record_path(out, aid), canonical_json(record), durable=False)
        return shown


class _Scratch:
    """Where runner.restored_ok puts a rejection's warning: dropped here (see _Restorer._checked)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []


def _identity(p: Path) -> tuple[int, int] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns

