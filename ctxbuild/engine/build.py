"""The driver behind `ctxbuild build`: (re)plan only when recipes changed, run ninja, write the manifest.

The no-op path never imports the planner (networkx alone costs ~0.25 s): it stats the generator inputs
recorded at plan time, the way ninja itself decides whether build.ninja is stale.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxbuild import machine, settings
from ctxbuild.plan import actionkey
from ctxbuild.engine import edited, links, ninja, outdir
from ctxbuild.engine.console import Console
from ctxbuild.toolchain import installed as toolchain
from ctxbuild.atomic import write_bytes, write_if_changed
from ctxbuild.errors import CtxbuildError, UsageError
from ctxbuild.layout import STATE, cache_dir, record_path, spec_name


# With an executor, ninja's -j (the cluster's slots) and Dask's resources bound compiles, not a local pool.
FARM_COMPILE_JOBS = 1024


@dataclass
class BuildOptions:
    paths: list[Path]
    out: Path
    jobs: int | None = None
    keep_going: int = 1
    targets: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    only_flag: str = "--only"  # the flag that named them, for messages (`verify --layers` passes one)
    dry_run: bool = False
    compile_jobs: int | None = None
    explain: bool = False
    verify: bool = True
    verify_only: bool = False  # `ctxbuild verify`: only the verify edges (and what they need)
    cache_env: dict[str, str] = field(default_factory=dict)
    memory_budget: int | None = None  # bytes concurrent actions may use (default: available at start)
    executor: str | None = None  # a Dask scheduler address, or "local"
    executor_fallback: str | None = None  # "local": build here when the scheduler is unreachable
    set_aside_failed: bool = True  # a failed verification's artifacts leave OUT/<target>/ (not for --layers)
    console: Console = field(default_factory=Console)  # -q, -v, --json
    summary: bool = True  # end with the summary (built/restored/failed, accuracy, report path)


def default_compile_jobs() -> int:
    """HTP compiles of large graphs take several GB each: bound by memory as well as cores."""
    cpus = os.cpu_count() or 1
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = 8.0
    return max(1, min(cpus, int(mem_gb // 4)))


def invocation(opts: BuildOptions) -> dict[str, Any]:
    return {"paths": sorted(str(p.resolve()) for p in opts.paths),
            "compile_jobs": opts.compile_jobs or default_compile_jobs(), "verify": opts.verify}


def ensure_planned(opts: BuildOptions) -> dict[str, Any]:
    """Re-plan if build.ninja is missing, the invocation changed, or a recipe/defaults file changed."""
    inv = invocation(opts)
    out = opts.out
    state = ninja.read_state(out, "plan.json")
    if state is None or ninja.read_state(out, "invocation.json") != inv or _stale(out, state):
        plan_and_render(out, inv)
        state = ninja.read_state(out, "plan.json")
        assert state is not None
    return state


def _stale(out: Path, state: dict[str, Any]) -> bool:
    try:
        built = (out / "build.ninja").stat().st_mtime_ns
    except OSError:
        return True
    for p in state["generator_deps"]:
        try:
            if os.stat(p).st_mtime_ns > built:
                return True
        except OSError:
            return True  # a recipe or directory went away
    return False


def plan_and_render(out: Path, inv: dict[str, Any]) -> None:
    from ctxbuild.engine import plancache

    if plancache.restore(out, inv):  # the same recipes were planned into this OUT path before
        toolchain.sdk_build_id(out / STATE)
        ninja.clean_dead(out, {a["id"] for a in (ninja.read_state(out, "plan.json") or {}).get("actions", [])})
        return
    from ctxbuild.recipes import recipe
    from ctxbuild.plan.planner import make_plan

    recipes = recipe.load([Path(p) for p in inv["paths"]])
    outdir.check_placement(out, outdir.source_dirs(recipes), "recipe/model directory")
    plan = make_plan(recipes, out, verify=inv["verify"])
    out.mkdir(parents=True, exist_ok=True)
    toolchain.sdk_build_id(out / STATE)  # warm the memo once, not in N parallel actions
    ninja.render(plan, compile_jobs=inv["compile_jobs"], invocation=inv)
    plancache.store(out, inv)


def regenerate(out: Path) -> None:
    """ninja's generator edge: re-plan with the recorded invocation."""
    inv = ninja.read_state(out, "invocation.json")
    if inv is None:
        raise UsageError(f"{out}: no recorded invocation; run `ctxbuild build` first")
    plan_and_render(out.resolve(), inv)


def ninja_targets(state: dict[str, Any], opts: BuildOptions) -> list[str]:
    if opts.verify_only:
        return ["verify"]
    recipes = sorted({r for a in state["actions"] for r in a["recipes"]})
    targets = sorted({a["target"]["name"] for a in state["actions"] if a["target"]})
    for name in opts.only:
        if name not in recipes:
            raise UsageError(f"{opts.only_flag} {name}: no such recipe", _close(name, recipes))
    if opts.targets:  # a device or marketing name selects its SoC's target ("Samsung Galaxy S24": SM8650)
        from ctxbuild.recipes.targets import lookup

        opts.targets = [n if n in targets or lookup(n) is None else lookup(n).name for n in opts.targets]
    for name in opts.targets:
        if name not in targets:
            raise UsageError(f"--target {name}: no recipe builds for it", _close(name, targets))
    if opts.only and opts.targets:
        pairs = [f"{r}@{t}" for r in opts.only for t in opts.targets]
        have = {f"{r}@{a['target']['name']}" for a in state["actions"] if a["target"] for r in a["recipes"]}
        return [p for p in pairs if p in have] or [f"recipe/{r}" for r in opts.only]
    if opts.only:
        return [f"recipe/{r}" for r in opts.only]
    if opts.targets:
        return [f"target/{t}" for t in opts.targets]
    return []


def _close(name: str, options: list[str]) -> str:
    from ctxbuild.recipes.suggest import did_you_mean  # difflib: only for a bad name, not on every build

    return did_you_mean(name, options, otherwise=f"known: {', '.join(options) or 'none'}") or ""


def build(opts: BuildOptions) -> int:
    """One build at a time per OUT; OUT never a source directory nor holding one (inside one is fine); what a
    bad recipe stopped leaves nothing behind."""
    opts.out = opts.out.resolve()
    outdir.check_placement(opts.out, outdir.recipe_dirs(opts.paths), "recipe directory")
    fresh = not opts.out.exists()
    had_state = (opts.out / STATE).exists()
    try:
        with outdir.locked(opts.out):
            return _build(opts)
    except CtxbuildError:
        if not (opts.out / "build.ninja").exists():  # a bad recipe or placement: leave no trace
            if fresh:
                shutil.rmtree(opts.out, ignore_errors=True)
            elif not had_state:  # e.g. -o <a model directory>, refused once the recipes were read
                shutil.rmtree(opts.out / STATE, ignore_errors=True)
        raise


def make_dry_run(makeflags: str) -> bool:
    """`make -n` runs recipe lines marked `+` (so that recursive makes can print what they would do): GNU
    make passes its single-letter flags as MAKEFLAGS' first word ("n -j2 ...", "kns"). A `ctxbuild build`
    under `make -n` is a dry run, as a recursive $(MAKE) would be."""
    first = makeflags.split(" ", 1)[0] if makeflags else ""
    return not first.startswith("-") and "=" not in first and "n" in first


def _build(opts: BuildOptions) -> int:
    started = time.monotonic()
    opts.dry_run = opts.dry_run or make_dry_run(os.environ.get("MAKEFLAGS", ""))
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
        if settings.REMOTE_CACHE.get(given := {**os.environ, **env}):  # the cache's modules load only then
            from ctxbuild.cache.backends import remote_warnings

            for w in remote_warnings(given):  # a malformed URL: exit 2, here, once
                print(f"ctxbuild: warning: {w}", file=sys.stderr)
        if opts.dry_run:
            return 0 if ninja.run(opts.out, targets, jobs=opts.jobs, keep_going=opts.keep_going, dry_run=True,
                                  env=env, console=opts.console) == 0 else 1
        if address is not None:  # before ninja's dry run (it makes output directories): a dead farm leaves none
            state, jobs_default = _start_farm(opts, address, stack, env, build_id, state)
            opts.jobs = opts.jobs or jobs_default
        _provision_toolchains(state, opts.console.info)
        _note_toolchain(opts.out, state)
        links.invalidate_retargeted(opts.out, state)  # before ninja: it follows links and sees old mtimes
        edited.remove_edited_outputs(opts.out, state)  # ninja sees an edited output as up to date
        pending = ninja.pending(opts.out, targets)
        if pending == []:  # nothing to run: no worker, no second ninja, no rewrite of unchanged summaries
            opts.console.info("ninja: no work to do.")
            _write_summary(opts.out, [])
            if _summaries_current(opts.out):
                return _conclude(opts, _deploy_gate(opts.out, None), noop=True)
            return _finish(opts, state, build_id, 0, started, noop=True)
        _remove_dead_temps(opts.out)
        from ctxbuild.engine import worker

        w = stack.enter_context(worker.running(opts.out / STATE / "worker.log"))
        # One more per provisioned toolchain the plan uses; each starts only when an edge of it connects.
        w_env = dict(w.env)
        for tc in _toolchains(state):
            w_env.update(stack.enter_context(worker.running(opts.out / STATE / f"worker-{tc}.log", tc)).env)
        os.environ.update(env)  # the cache settings, for the actions restored in this process
        if pending is None:
            w.start()
        else:
            from ctxbuild.engine.prerestore import restore_pending

            if restore_pending(opts.out, state, pending, build_id, on_miss=w.start, say=opts.console.info):
                return _finish(opts, state, build_id, 0, started)  # all restored: ninja has nothing to do
        # Without -j, ninja 1.13.2 (PyPI) takes its slots from make's jobserver itself, fifo or pipe (make 4.3)
        rc = ninja.run(opts.out, targets, jobs=opts.jobs, keep_going=opts.keep_going, dry_run=False,
                       env={**env, **w_env}, console=opts.console)
    return _finish(opts, state, build_id, rc, started)


def _finish(opts: BuildOptions, state: dict[str, Any], build_id: str, rc: int, started: float, *,
            noop: bool = False) -> int:
    """Records -> summary, --explain, invalidation after failures, manifest and report."""
    from ctxbuild.outputs.manifest import read_records, write as write_manifest

    records = read_records(opts.out)
    ran = [r for r in records.values() if r.get("build_id") == build_id]
    _write_summary(opts.out, ran)
    if opts.explain:
        for r in sorted(ran, key=lambda r: (r.get("started") or 0, r["id"])):
            print(f"explain: {r['id']}: {_explain(r)}")
    failed = [r for r in ran if r.get("status") == "failed"]
    _invalidate_downstream(opts.out, state, {r["id"] for r in failed})
    # `ctxbuild build` only: `ctxbuild verify` (and --layers, which reads them next) checks what a build placed.
    aside = [] if opts.verify_only or not opts.set_aside_failed else _set_aside_unverified(opts.out, state, {r["id"] for r in failed})
    for kept in sorted({p.parent for p in aside}):
        print(f"ctxbuild: failed verification: what it verified is in {kept}, out of the deliverable tree "
              "(OUT/<target>/)", file=sys.stderr)
    manifest = write_manifest(opts.out, ninja.read_state(opts.out, "plan.json") or state, toolchain.summary(opts.out / STATE))
    from ctxbuild.outputs.report import write_report  # OUT/report.html + report.json; never fails the build
    write_report(opts.out, build_id=build_id, returncode=rc, wall_seconds=time.monotonic() - started,
                 driver_peak_rss=machine.peak_rss(children=False))  # not ninja's, not the worker's
    _note_summarized(opts.out)
    if opts.summary and not opts.console.quiet and not opts.console.json:
        from ctxbuild.outputs.summary import rewrites

        for line in rewrites(ran):  # one per model legalization rewrote in this build
            print(line)
    if rc != 0:
        for r in failed:  # each failure once: ninja's FAILED header and the action's own error line are not shown
            print(f"ctxbuild: FAILED {r['id']}: {r.get('cause', 'see log')} (log: {opts.out / r['log']})",
                  file=sys.stderr)
        if not failed:
            print("ctxbuild: ninja failed before running an action (see above)", file=sys.stderr)
        return _conclude(opts, 1, noop=noop)
    return _conclude(opts, _deploy_gate(opts.out, manifest), noop=noop)


def _deploy_gate(out: Path, manifest: dict[str, Any] | None) -> int:
    """At the end, after everything is built: 1 if a wrapper will not load on a runtime its recipe declares."""
    from ctxbuild.outputs.gate import blocked

    if manifest is None:
        try:
            manifest = json.loads((out / "manifest.json").read_text())
        except (OSError, ValueError):
            return 0
    lines = blocked(manifest)
    for line in lines:
        print(f"ctxbuild: FAILED deploy gate: {line}", file=sys.stderr)
    return 1 if lines else 0


def _conclude(opts: BuildOptions, rc: int, *, noop: bool) -> int:
    """The summary (last lines: accuracy per graph, the report's path), or with --json the results document."""
    from ctxbuild.outputs import summary

    if opts.console.json:
        print(json.dumps(summary.document(opts.out, rc, noop=noop), indent=2))
    elif opts.summary and not opts.console.quiet:
        sys.stderr.flush()
        for line in summary.text(summary.document(opts.out, rc, noop=noop)):
            print(line)
    return rc


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


_SUMMARIES = ("manifest.json", "report.json", "report.html")


def _summary_inputs(out: Path) -> list[int]:
    """What manifest and report are made of, as stamps: records (a record written or removed changes the
    directory's mtime) and the plan."""
    stamps = []
    for p in (out / STATE / "records", out / STATE / "plan.json"):
        try:
            stamps.append(os.stat(p).st_mtime_ns)
        except OSError:
            stamps.append(0)
    return stamps


def _summaries_current(out: Path) -> bool:
    """True if manifest and report were written from the records and plan as they are now."""
    if not all((out / name).is_file() for name in _SUMMARIES):
        return False
    return ninja.read_state(out, "summarized.json") == {"inputs": _summary_inputs(out)}


def _note_summarized(out: Path) -> None:
    write_if_changed(out / STATE / "summarized.json", json.dumps({"inputs": _summary_inputs(out)}).encode(),
                     durable=False)


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


def _invalidate_downstream(out: Path, state: dict[str, Any], failed: set[str]) -> None:
    """Outputs downstream of a failed action were not rebuilt and are stale: remove them and their records."""
    consumers: dict[str, list[str]] = {}
    for a in state["actions"]:
        for d in a["deps"]:
            consumers.setdefault(d, []).append(a["id"])
    by_id = {a["id"]: a for a in state["actions"]}
    todo, seen = list(failed), set(failed)
    while todo:
        for c in consumers.get(todo.pop(), []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
                for p in by_id[c]["outputs"]:
                    Path(p).unlink(missing_ok=True)
                record_path(out, c).unlink(missing_ok=True)


def _set_aside_unverified(out: Path, state: dict[str, Any], failed: set[str]) -> list[Path]:
    """The deliverables a failed verification checked (its compile's wrapper and binary) move from
    OUT/<target>/ to OUT/.ctxbuild/failed/<target>/: a packaging step copying OUT/<target>/ must not ship
    them. The next build restores them by key (cheap) and verifies again. Returns where they went."""
    from ctxbuild.plan import kinds

    by_id = {a["id"]: a for a in state["actions"]}
    moved = []
    for action_id in sorted(failed):
        a = by_id.get(action_id)
        if a is None or not kinds.get(a["kind"]).verification:
            continue
        for dep in a["deps"]:
            if not kinds.get(by_id[dep]["kind"]).deliverable:
                continue
            for p in map(Path, by_id[dep]["outputs"]):
                if p.is_file() and p.is_relative_to(out) and not p.is_relative_to(out / STATE):
                    dest = out / STATE / "failed" / p.relative_to(out)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(p, dest)
                    moved.append(dest)
    return moved


def _explain(r: dict[str, Any]) -> str:
    if r.get("status") == "failed":
        return f"failed: {r.get('cause')}"
    if r.get("source") == "cache":
        src = "restored from cache" + (" (remote)" if r.get("cache_origin") == "remote" else "")
    elif r.get("cache_origin") == "farm":
        src = f"ran on {r.get('farm', {}).get('worker')}: not in cache"
    elif r.get("cache_origin") == "off":
        src = "ran: cache disabled"
    else:
        src = "ran: not in cache"
    return f"{src}; {r.get('why', '')}"


def _toolchains(state: dict[str, Any]) -> list[str]:
    """The provisioned toolchains the plan's actions run in (not the installed one)."""
    return sorted({a["toolchain"] for a in state["actions"] if a.get("toolchain")})


def _provision_toolchains(state: dict[str, Any], say: Any) -> None:
    """Every toolchain the plan uses, provisioned before anything is keyed (a no-op reads one JSON each)."""
    from ctxbuild.toolchain import choose, provision

    for name in _toolchains(state):
        provision.ensure(choose.by_name(name), say)


def _note_toolchain(out: Path, state: dict[str, Any]) -> None:
    """ninja cannot see a toolchain upgrade (same command, same input files), so when an action kind's
    toolchain fingerprint differs from the last build's in this OUT, touch those actions' spec files (an
    input of every edge): ninja re-runs them and each re-keys (a cache hit if that toolchain built it before).
    Kinds are told apart per toolchain (`compile@onnxruntime-qnn-2.3.0`)."""
    def slot(a: dict[str, Any]) -> str:
        return a["kind"] + (f"@{a['toolchain']}" if a.get("toolchain") else "")

    kinds = sorted({slot(a) for a in state["actions"]})
    # a no-op build stops here: fingerprints need importlib.metadata
    stamp = [actionkey.ACTION_SCHEMA_VERSION, toolchain.quick_stamp(tuple(_toolchains(state)))]
    seen = ninja.read_state(out, "toolchain_seen.json") or {}
    before = seen.get("kinds")
    if seen.get("stamp") == stamp and before is not None and set(kinds) <= set(before):
        return
    now = {k: actionkey.fingerprint(k.partition("@")[0], out / STATE, k.partition("@")[2] or None) for k in kinds}
    if before is not None:
        changed = {k for k in kinds if k in before and before[k] != now[k]}
        for a in state["actions"]:
            if slot(a) in changed:
                try:
                    os.utime(out / STATE / "actions" / spec_name(a["id"]))
                except OSError:
                    pass
    write_bytes(out / STATE / "toolchain_seen.json", json.dumps({"stamp": stamp, "kinds": now}, sort_keys=True).encode(),
                durable=False)


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


def _write_summary(out: Path, ran: list[dict[str, Any]]) -> None:
    """What the last build did (cache hits, failures): read by `cache stats` and the report. A copy goes
    into the cache dir, so `ctxbuild cache stats` needs no OUT."""
    summary = {"ran": len(ran), "from_cache": sum(r.get("source") == "cache" for r in ran),
               "executed": sum(r.get("source") == "run" for r in ran),
               "failed": sum(r.get("status") == "failed" for r in ran),
               "actions": {r["id"]: r.get("source") or r.get("status") for r in ran}}
    write_if_changed(out / STATE / "last_build.json", json.dumps(summary).encode(), durable=False)
    if settings.NO_CACHE.get() or not ran:  # a no-op keeps the last real build's figures
        return
    hits = [r for r in ran if r.get("source") == "cache"]
    cached = {**summary, "out": str(out), "finished": time.time(), "hits": len(hits),
              "hits_local": sum(r.get("cache_origin") != "remote" for r in hits),
              "hits_remote": sum(r.get("cache_origin") == "remote" for r in hits),
              "misses": sum(r.get("source") == "run" and r.get("cache_origin") != "off" for r in ran)}
    try:
        write_bytes(cache_dir() / "last_build.json", json.dumps(cached).encode())
    except OSError:  # a read-only or full cache dir: the actions already warned about it
        pass
