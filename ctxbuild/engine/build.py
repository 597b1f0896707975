"""The driver behind `ctxbuild build`: (re)plan only when recipes changed (replan.py), restore what the
cache has and run ninja for the rest, then write manifest and report (finish.py).
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ctxbuild import machine, settings
from ctxbuild.engine import console, ninja, outdir, owner, toolchains
from ctxbuild.engine.fast import edited, links
from ctxbuild.engine.finish import (
    conclude, deploy_gate, finish, set_aside_interrupted, summaries_current, write_summary,
)
from ctxbuild.engine.options import BuildOptions, make_dry_run, ninja_targets, selection
from ctxbuild.engine.fast.replan import current, ensure_planned, invocation
from ctxbuild.errors import CtxbuildError
from ctxbuild.layout import STATE


# With an executor, ninja's -j (the cluster's slots) and Dask's resources bound compiles, not a local pool.
FARM_COMPILE_JOBS = 1024


def build(opts: BuildOptions) -> int:
    """One build at a time per OUT; OUT never a source directory nor holding one (inside one is fine); what a
    bad recipe stopped leaves nothing behind."""
    opts.out = opts.out.resolve()
    outdir.check_placement(opts.out, outdir.recipe_dirs(opts.paths), "recipe directory")
    owner.refuse_foreign(opts.out)
    if opts.dry_run or make_dry_run(os.environ.get("MAKEFLAGS", "")):
        return _dry_run(opts)
    fresh = not opts.out.exists()
    had_state = (opts.out / STATE).exists()
    try:
        with outdir.locked(opts.out):
            owner.bind(opts.out)  # a moved or copied OUT is re-bound before anything else is written
            return _build(opts)
    except CtxbuildError:
        if not (opts.out / "build.ninja").exists():  # a bad recipe or placement: leave no trace
            if fresh:
                shutil.rmtree(opts.out, ignore_errors=True)
            elif not had_state:  # e.g. -o <a model directory>, refused once the recipes were read
                shutil.rmtree(opts.out / STATE, ignore_errors=True)
        raise


def _dry_run(opts: BuildOptions) -> int:
    """What the build would run, written nowhere (engine/dryrun.py): ninja's answer if OUT's plan is current,
    else every action a plan made in memory holds for the targets."""
    from ctxbuild.engine import dryrun

    os.environ.update(opts.cache_env)  # as in a build: the planner's memos follow --cache-dir
    state = ninja.read_state(opts.out, "plan.json")
    _executor(opts, state)  # a bad address is a usage error here too; the compile pool follows the cluster
    inv = invocation(opts)
    planned = current(opts.out, inv, state) and owner.bound(opts.out)  # a moved OUT's plan names the original
    plan = state if state is not None and planned else dryrun.plan_in_memory(opts.out, inv)
    targets = ninja_targets(plan, opts)
    _warn_remote(_cache_settings(plan.get("cache", {}), {}))
    actions = dryrun.out_of_date(opts.out, plan, targets) if planned else dryrun.needed(plan, targets)
    if actions is None:  # ninja cannot read build.ninja: its own message says why
        ninja.run(opts.out, targets, jobs=opts.jobs, keep_going=opts.keep_going, dry_run=True, console=opts.console)
        return 1
    return dryrun.show(opts.out, actions, opts.console)


def _build(opts: BuildOptions) -> int:
    started = time.monotonic()
    os.environ.update(opts.cache_env)  # the driver's own cache lookups (toolchain memo) follow the flags too
    os.environ[settings.MEMORY_BUDGET.name] = str(opts.memory_budget or machine.default_budget())  # for the worker
    build_id = os.urandom(16).hex()
    env = {settings.BUILD_ID.name: build_id, **opts.cache_env}
    with ExitStack() as stack:
        # Known before planning where possible: with an executor, the compile pool follows the cluster.
        address = _executor(opts, None if opts.executor or settings.EXECUTOR.get()
                            else ninja.read_state(opts.out, "plan.json"))
        state = ensure_planned(opts)
        if address is None and (address := _executor(opts, state)) is not None:  # first build with `executor:`
            state = ensure_planned(opts)
        targets = ninja_targets(state, opts)
        env.update(_cache_settings(state.get("cache", {}), env))
        _warn_remote(env)
        if address is not None:  # before ninja's dry run (it makes output directories): a dead farm leaves none
            state, jobs_default = _start_farm(opts, address, stack, env, build_id, state)
            opts.jobs = opts.jobs or jobs_default
        toolchains.ensure_provisioned(state, opts.console.info, opts.console.live if opts.console.tty() else None)
        toolchains.note_changes(opts.out, state)
        links.invalidate_retargeted(opts.out, state)  # before ninja: it follows links and sees old mtimes
        edited.remove_edited_outputs(opts.out, state)  # ninja sees an edited output as up to date
        pending = ninja.pending(opts.out, targets)
        if pending == []:  # nothing to run: no worker, no second ninja, no rewrite of unchanged summaries
            write_summary(opts.out, [])
            if summaries_current(opts.out, selection(opts)):
                return conclude(opts, deploy_gate(opts.out, None), noop=True)
            return finish(opts, state, build_id, 0, started, noop=True)
        _remove_dead_temps(opts.out)
        from ctxbuild.engine.run import worker

        w = stack.enter_context(worker.running(opts.out / STATE / "worker.log"))
        # One more per provisioned toolchain the plan uses; each starts only when an edge of it connects.
        w_env = dict(w.env)
        for tc in toolchains.used(state):
            w_env.update(stack.enter_context(worker.running(opts.out / STATE / f"worker-{tc}.log", tc)).env)
        os.environ.update(env)  # the cache settings, for the actions restored in this process
        try:
            if pending is None:
                w.start()
            else:
                from ctxbuild.engine.fast.prerestore import restore_pending

                if restore_pending(opts.out, state, pending, build_id, on_miss=w.start, say=opts.console.info):
                    return finish(opts, state, build_id, 0, started)  # all restored: ninja has nothing to do
            opts.console.progress = console.progress_lines(opts.out, state["actions"])
            # Without -j, ninja 1.13.2 (PyPI) takes its slots from make's jobserver itself, fifo or pipe (make 4.3)
            rc = ninja.run(opts.out, targets, jobs=opts.jobs, keep_going=opts.keep_going, dry_run=False,
                           env={**env, **w_env}, console=opts.console)
        except KeyboardInterrupt:  # what was restored or built but not verified leaves OUT/<target>/
            set_aside_interrupted(opts, state)
            raise
    return finish(opts, state, build_id, rc, started)


def _executor(opts: BuildOptions, state: dict[str, Any] | None) -> str | None:
    """The executor address (--executor, else $CTXBUILD_EXECUTOR, else `executor:` in the plan's defaults;
    "local", the default: None); sets the compile pool. The farm's modules load only when there is one."""
    address = opts.executor or settings.EXECUTOR.get() or (state or {}).get("cache", {}).get("executor")
    address = None if address in (None, "", "local") else address
    if address is not None:
        from ctxbuild.engine.farm.gateway import check_address

        check_address(address)
    if address is not None and opts.compile_jobs is None:
        opts.compile_jobs = FARM_COMPILE_JOBS
    return address


def _start_farm(opts: BuildOptions, address: str, stack: ExitStack, env: dict[str, str], build_id: str,
                state: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """Connect for the build; returns the (possibly re-planned) state and ninja's -j (the cluster's slots)."""
    from ctxbuild.engine.farm import gateway

    store = gateway.check_data_plane({**os.environ, **env})
    fallback = opts.executor_fallback or settings.EXECUTOR_FALLBACK.get()
    farm = stack.enter_context(gateway.running(address, store=store, build_id=build_id, fallback=fallback))
    if farm is None:  # unreachable, and the user asked to build locally: the local compile pool again
        if opts.compile_jobs == FARM_COMPILE_JOBS:
            opts.compile_jobs = None
        return ensure_planned(opts), None
    env.update(farm.env)
    return state, farm.slots


def _warn_remote(env: dict[str, str]) -> None:
    """A remote cache's warnings (a bad token, a server skipped lately), once per build; a malformed URL is a
    usage error (exit 2), here. The cache's modules load only when there is a remote."""
    if settings.REMOTE_CACHE.get(given := {**os.environ, **env}):
        from ctxbuild.cache.backends import remote_warnings

        for w in remote_warnings(given):
            print(f"ctxbuild: warning: {w}", file=sys.stderr)


def _cache_settings(defaults: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """`cache:` in _defaults.yaml, unless a flag or the environment already says otherwise."""
    given = {**os.environ, **env}
    out: dict[str, str] = {}
    if "remote" in defaults and settings.REMOTE_CACHE.name not in given:
        out[settings.REMOTE_CACHE.name] = defaults["remote"]
    if defaults.get("remote_read_only") and settings.REMOTE_READ_ONLY.name not in given:
        out[settings.REMOTE_READ_ONLY.name] = "1"
    if "token_env" in defaults and settings.REMOTE_TOKEN_ENV.name not in given:
        out[settings.REMOTE_TOKEN_ENV.name] = defaults["token_env"]
    if "max_download" in defaults and settings.REMOTE_MAX_DOWNLOAD.name not in given:
        from ctxbuild.units import parse_size  # the schema checked its form, with the file's line

        out[settings.REMOTE_MAX_DOWNLOAD.name] = str(parse_size(str(defaults["max_download"]), "cache.max_download"))
    return out


def _remove_dead_temps(out: Path) -> None:
    """Work dirs (OUT/.ctxbuild/tmp/<action>.<pid>) of action processes that were killed."""

    try:
        entries = list(os.scandir(out / STATE / "tmp"))
    except OSError:
        return
    for e in entries:
        pid = e.name.rpartition(".")[2]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(e.path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:  # a killed action whose parent died too can stay a zombie until init reaps it: dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
