"""The end of a build: records -> what the last build did, --explain, the outputs a failure left stale,
what was not verified set aside (OUT/<target>/ holds what passed), manifest and report, the deploy gate, and the last lines."""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from ctxbuild import machine, settings
from ctxbuild.atomic import write_bytes, write_if_changed
from ctxbuild.engine import ninja
from ctxbuild.engine.options import BuildOptions, ninja_targets, selection
from ctxbuild.layout import STATE, cache_dir, record_path, spec_name
from ctxbuild.toolchain import installed as toolchain


def finish(opts: BuildOptions, state: dict[str, Any], build_id: str, rc: int, started: float, *,
            noop: bool = False) -> int:
    """Records -> summary, --explain, invalidation after failures, manifest and report."""
    from ctxbuild.outputs.manifest import read_records, write as write_manifest

    plan = ninja.read_state(opts.out, "plan.json") or state  # the whole plan OUT holds, read once
    pending = set() if rc == 0 else pending_actions(opts.out, ninja_targets(state, opts), plan)
    forget_pending(opts.out, plan, pending, build_id)
    records = read_records(opts.out)
    ran = [r for r in records.values() if r.get("build_id") == build_id]
    write_summary(opts.out, ran)
    if opts.explain:
        for r in sorted(ran, key=lambda r: (r.get("started") or 0, r["id"])):
            print(f"explain: {r['id']}: {_explain(r)}")
    _drop_stale_diagnoses(state, ran)
    failed = [r for r in ran if r.get("status") == "failed"]
    if opts.recipe_args:
        _complete_commands(opts.out, failed, opts.recipe_args)
    if rc != 0:  # every failure the recipe's own mistake (a RecipeError in an action): a bad recipe, exit 2
        rc = 2 if failed and all(r.get("exit_code") == 2 for r in failed) else 1
    _invalidate_downstream(opts.out, state, {r["id"] for r in failed})
    if opts.set_aside_failed:  # --layers sets aside after its diagnosis, which reads the failed graph's files
        ship_only_verified(opts.out, state, pending=pending)
    manifest = write_manifest(opts.out, plan, toolchain.summary(opts.out / STATE))
    from ctxbuild.outputs.report import write_report  # OUT/report.html + report.json; never fails the build
    write_report(opts.out, build_id=build_id, returncode=rc, wall_seconds=time.monotonic() - started,
                 driver_peak_rss=machine.peak_rss(children=False),  # not ninja's, not the worker's
                 selection=selection(opts))
    _note_summarized(opts.out, selection(opts))
    if not opts.console.json:
        for w in dict.fromkeys(w for r in ran for w in r.get("cache_warnings") or []):
            print(f"ctxbuild: warning: {w}", file=sys.stderr)
    if opts.summary and not opts.console.quiet and not opts.console.json:
        from ctxbuild.outputs.summary import pins, rewrites, sibling_skips

        # one per model legalization rewrote; a mixed answer to pin; a search's skips on a sibling SoC's measurement
        for line in rewrites(ran) + pins(ran) + sibling_skips(ran):
            print(line)
    if rc != 0:
        for r in failed:  # each failure once: ninja's FAILED header and the action's own error line are not shown
            print(f"ctxbuild: FAILED {r['id']}: {r.get('cause', 'see log')} (log: {opts.out / r['log']})",
                  file=sys.stderr)
        if not failed:  # ninja itself stopped (killed, or a manifest it refused)
            print(f"ctxbuild: ninja stopped after {len(ran)} action(s), none failed (see above)" if ran else
                  "ctxbuild: ninja failed before running an action (see above)", file=sys.stderr)
        return conclude(opts, rc, noop=noop, ran=ran)
    return conclude(opts, deploy_gate(opts.out, manifest), noop=noop, ran=ran)


LAYERS_COMMAND = re.compile(r"`ctxbuild verify --layers (\S+)`")  # verify's hint (verify/advice.py)


def _complete_commands(out: Path, failed: list[dict[str, Any]], recipe_args: tuple[str, ...]) -> None:
    """A failed action's hint gives a command to paste, written by the action, which does not know the command
    line: it gets this build's -C, PATHS and -o, in the record too (the report and --json show its cause)."""
    from ctxbuild.digests import canonical_json

    for r in failed:
        cause = LAYERS_COMMAND.sub(lambda m: f"`ctxbuild verify --layers {m[1]} {' '.join(recipe_args)}`",
                                   r.get("cause") or "")
        if cause != (r.get("cause") or ""):
            r["cause"] = cause
            write_bytes(record_path(out, r["id"]), canonical_json(r), durable=False)


def deploy_gate(out: Path, manifest: dict[str, Any] | None) -> int:
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


def conclude(opts: BuildOptions, rc: int, *, noop: bool, ran: list[dict[str, Any]] | None = None) -> int:
    """The summary (last lines: accuracy per graph, the report's path), or with --json the results document.
    `ran`: the records of this build's actions (finish printed their pin lines already)."""
    from ctxbuild.outputs import summary

    if not (opts.summary and (opts.console.json or not opts.console.quiet)):
        return rc  # without the summary (--layers) the caller prints its own
    searched = stored_selects(opts.out) if noop else ran or []
    doc = summary.document(opts.out, rc, noop=noop, searched=searched)
    if opts.console.json:
        print(json.dumps(doc, indent=2))
    else:
        sys.stderr.flush()
        for line in (summary.pins(searched) if noop else []) + summary.text(doc):
            print(line)
    return rc


def stored_selects(out: Path) -> list[dict[str, Any]]:
    """A build that ran nothing: the records of the precision searches OUT's plan holds, whose answers it reports
    as the build that decided them did (the user pastes the pin lines; a second look should not need
    <recipe>_search.json)."""
    from ctxbuild.outputs.manifest import read_record
    from ctxbuild.plan import kinds

    actions = (ninja.read_state(out, "plan.json") or {}).get("actions", [])
    selects = [a["id"] for a in actions if kinds.get(a["kind"]).picks_candidate]
    return [r for r in (read_record(out, i) for i in selects) if r]


def _explain(r: dict[str, Any]) -> str:
    if r.get("status") == "failed":
        return f"failed: {r.get('cause')}"
    if r.get("not_needed"):  # not counted as built or restored either
        return "not needed by the precision search (an earlier candidate decided it): placeholders only"
    if r.get("source") == "cache":
        src = "restored from cache" + (" (remote)" if r.get("cache_origin") == "remote" else "")
    elif r.get("cache_origin") == "farm":
        src = f"ran on {r.get('farm', {}).get('worker')}: not in cache"
    elif r.get("cache_origin") == "off":
        src = "ran: cache disabled"
    else:
        src = "ran: not in cache"
    return f"{src}; {r.get('why', '')}"


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


def set_aside_interrupted(opts: BuildOptions, state: dict[str, Any]) -> None:
    """Ctrl-C stopped ninja: what the build made but did not verify leaves OUT/<target>/, as after a failure (a
    step copying OUT/<target>/ must not ship it); the rest of finish (records, report) waits for the next build."""
    if opts.set_aside_failed:
        plan = ninja.read_state(opts.out, "plan.json") or state
        ship_only_verified(opts.out, state, pending=pending_actions(opts.out, ninja_targets(state, opts), plan,
                                                                   after_interrupt=True))


def pending_actions(out: Path, targets: list[str], plan: dict[str, Any], *, after_interrupt: bool = False) -> set[str]:
    """The actions of `plan` a build of `targets` would still run in OUT (after a failed or stopped build: what
    did not run and is not up to date), read from ninja's dry run, whose commands name each action's spec file."""
    names = set(re.findall(r"actions/(\S+?\.json)",
                           "\n".join(ninja.pending(out, targets, after_interrupt=after_interrupt) or [])))
    return {a["id"] for a in plan["actions"] if spec_name(a["id"]) in names}


def forget_pending(out: Path, state: dict[str, Any], pending: set[str], build_id: str) -> None:
    """What the build stopped before is not a result of it: an earlier build's record (its figures, its
    "ok") and its result files beside the deliverables (a verify's JSON, a diagnosis) would be shown as this
    build's. Their records go, and their outputs outside OUT/.ctxbuild/ except deliverables, which
    ship_only_verified sets aside (the next build restores them by key). Actions that failed in this build
    are pending too: their records stay."""
    from ctxbuild.outputs.manifest import read_record
    from ctxbuild.plan import kinds

    for a in state["actions"]:
        if a["id"] not in pending or (read_record(out, a["id"]) or {}).get("build_id") == build_id:
            continue
        record_path(out, a["id"]).unlink(missing_ok=True)
        if kinds.get(a["kind"]).deliverable:
            continue
        for p in map(Path, a["outputs"]):
            if p.is_relative_to(out) and not p.is_relative_to(out / STATE):
                p.unlink(missing_ok=True)


def _drop_stale_diagnoses(state: dict[str, Any], ran: list[dict[str, Any]]) -> None:
    """A `<graph>_layers.json` that `verify --layers` wrote before the graph was verified again in this build
    describes another artifact (an int16 diagnosis beside fp16 files): it goes."""
    from ctxbuild.layout import layers_path
    from ctxbuild.plan import kinds

    by_id = {a["id"]: a for a in state["actions"]}
    for r in ran:
        result = (by_id.get(r["id"]) or {}).get("outputs") or []
        if r.get("kind") and kinds.get(r["kind"]).per_layer and result:
            layers = layers_path(result[0])
            try:
                if layers.stat().st_mtime < (r.get("finished") or 0):
                    layers.unlink()
            except OSError:
                pass


def ship_only_verified(out: Path, state: dict[str, Any], *, pending: set[str]) -> None:
    """OUT/<target>/ holds only deliverables whose verification passed: one whose verification failed, or did not
    run (the build stopped first: `pending`), moves to OUT/.ctxbuild/failed/<target>/, where a packaging step
    copying OUT/<target>/ cannot ship it; the next build restores it by key (cheap) and verifies it. A deliverable
    that passed drops any copy an earlier failure left there. Deliverables with no verification planned (verify
    off) stay: the manifest says so."""
    from ctxbuild.outputs.manifest import read_records
    from ctxbuild.plan import kinds

    by_id = {a["id"]: a for a in state["actions"]}
    status = {i: r.get("status") for i, r in read_records(out).items()}  # read after the stale ones went
    judges: dict[str, list[str]] = {}
    for a in state["actions"]:
        if kinds.get(a["kind"]).verdict or kinds.get(a["kind"]).picks_candidate:
            for dep in [a["id"], *a["deps"]]:
                if dep in by_id and kinds.get(by_id[dep]["kind"]).deliverable:
                    judges.setdefault(dep, []).append(a["id"])
        for dep in a["deps"]:  # a package is whole or not there: its variants go aside unless its manifest is made
            if dep in by_id and kinds.get(by_id[dep]["kind"]).package_part:
                judges.setdefault(dep, []).append(a["id"])
    moved: set[Path] = set()
    for deliverable, verifiers in sorted(judges.items()):
        passed = all(v not in pending and status.get(v) == "ok" for v in verifiers)
        for p in map(Path, by_id[deliverable]["outputs"]):
            if not p.is_relative_to(out) or p.is_relative_to(out / STATE):
                continue
            aside = out / STATE / "failed" / p.relative_to(out)
            if passed:
                aside.unlink(missing_ok=True)
            elif p.is_file():
                aside.parent.mkdir(parents=True, exist_ok=True)
                os.replace(p, aside)
                moved.add(aside.parent)
    for d in sorted({p.parent for a in by_id.values() for p in map(Path, a["outputs"])}, reverse=True):
        while d.is_relative_to(out) and d != out and d.is_dir() and not any(d.iterdir()):
            d.rmdir()  # a target dir whose every deliverable moved aside
            d = d.parent
    for kept in sorted(moved):
        print(f"ctxbuild: not verified in this build (failed or not run): what it built is in {kept}, out of the "
              "deliverable tree (OUT/<target>/)", file=sys.stderr)


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


def summaries_current(out: Path, limited: dict[str, list[str]]) -> bool:
    """True if manifest and report were written from the records and plan as they are now, for the same
    --only/--target selection (`limited`: the report shows only its rows)."""
    if not all((out / name).is_file() for name in _SUMMARIES):
        return False
    return ninja.read_state(out, "summarized.json") == {"inputs": _summary_inputs(out), "selection": limited}


def _note_summarized(out: Path, limited: dict[str, list[str]]) -> None:
    write_if_changed(out / STATE / "summarized.json",
                     json.dumps({"inputs": _summary_inputs(out), "selection": limited}).encode(), durable=False)


def write_summary(out: Path, ran: list[dict[str, Any]]) -> None:
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
