"""`ctxbuild verify --layers RECIPE`: build and verify the recipe, then diagnose each of its verified graphs
per layer (diagnose.py), print the worst nodes and write `<graph>_layers.json` beside `<graph>_verify.json`
(the report shows it for failed graphs); for a precision search, per target, the candidate it ships or the one
that came closest. With --json: one document holding every diagnosis."""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ctxbuild.plan import kinds
from ctxbuild.plan.action import Action, load_spec
from ctxbuild.capture import captured
from ctxbuild.errors import UsageError
from ctxbuild.layout import STATE, layers_path, spec_name


def main(paths: list[Path], out: Path, recipe: str, targets: list[str], *, samples: int | None,
         cache_env: dict[str, str], as_json: bool, recipe_args: tuple[str, ...] = ()) -> int:
    from ctxbuild.verify import diagnose
    from ctxbuild.engine import ninja
    from ctxbuild.engine.build import build
    from ctxbuild.engine.console import Console
    from ctxbuild.engine.finish import ship_only_verified
    from ctxbuild.outputs.manifest import write as write_manifest
    from ctxbuild.toolchain import installed as toolchain
    from ctxbuild.engine.options import BuildOptions, make_dry_run
    from ctxbuild.outputs.report import write_report

    out = out.resolve()
    rc = build(BuildOptions(paths=paths, out=out, only=[recipe], only_flag="--layers", targets=targets,
                            cache_env=cache_env, recipe_args=recipe_args,
                            set_aside_failed=False,  # the diagnosis reads the failed graph's artifacts
                            summary=False, console=Console(json=as_json)))  # the diagnosis follows instead
    if make_dry_run(os.environ.get("MAKEFLAGS", "")):  # under `make -n` the build only said what it would run
        return rc
    state = ninja.read_state(out, "plan.json") or {"actions": []}
    verifies = [load_spec(out / STATE / "actions" / spec_name(a["id"])) for a in state["actions"]
                if kinds.get(a["kind"]).per_layer and recipe in a["recipes"]
                and (not targets or a["target"]["name"] in targets)]
    if not verifies:
        raise UsageError(f"--layers {recipe}: the recipe has no verified graph"
                         + (f" for {', '.join(targets)}" if targets else ""), "is verification off for it?")
    by_output = {p: a for a in state["actions"] for p in a["outputs"]}

    def spec_of(output: str) -> Action:
        return load_spec(out / STATE / "actions" / spec_name(by_output[output]["id"]))

    selects = [spec_of(a["outputs"][0]) for a in state["actions"]
               if kinds.get(a["kind"]).picks_candidate and recipe in a["recipes"]
               and (not targets or a["target"]["name"] in targets)]
    jobs = [_Job(v, v.params["thresholds"], layers_path(v.outputs["result"])) for v in verifies
            if "thresholds" in v.params]  # the rest are a precision search's candidates, judged by its select
    for s in selects:
        if (job := _searched(s, spec_of)) is not None:
            jobs.append(job)
        else:
            print(f"ctxbuild: {s.id}: nothing measured to diagnose (the build failed before the search measured a "
                  "candidate)", file=sys.stderr)
            rc = rc or 1
    diagnoses = []
    for job in jobs:
        v = job.verify
        compiler = spec_of(v.inputs["ctx.ctx"])
        if job.htp and not Path(v.inputs["ctx.ctx"]).is_file():
            print(f"ctxbuild: {v.id}: nothing compiled to diagnose (the build failed before verification)",
                  file=sys.stderr)
            rc = rc or 1
            continue
        if job.why and not as_json:
            print(f"{v.params['graph']}@{v.target['name']}: {job.why}")
        started = time.monotonic()
        log = out / STATE / "logs" / f"layers.{v.id.split('/', 1)[1]}.log"
        with captured(log):  # the EP's native logging, as for actions
            result = diagnose.diagnose(Path(v.inputs["reference"]), Path(v.inputs["compiled"]), _samples(v, samples),
                                       compiler.params, job.thresholds, slices=v.params.get("slices"),
                                       delivered=Path(v.inputs["ctx.ctx"]) if job.htp else None,
                                       timeout=v.params["timeout_s"], htp=job.htp)
        result.update({"graph": v.params["graph"], "target": v.target["name"] if v.target else "",
                       "verify": v.id, "seconds": round(time.monotonic() - started, 1),
                       **({"candidate": job.candidate} if job.candidate else {})})
        diagnose.write(job.written, result)
        diagnoses.append({**result, "written": str(job.written)})
        if not as_json:
            print(diagnose.format_text(result))
            print(f"  written: {job.written}")
    ship_only_verified(out, state, pending=set())  # the build left the failed graph in place for the diagnosis
    write_manifest(out, state, toolchain.summary(out / STATE))
    write_report(out)
    if as_json:
        print(json.dumps({"ok": rc == 0, "exit_code": rc, "error": None, "out": str(out), "diagnoses": diagnoses},
                         indent=2, sort_keys=True))
    return rc


@dataclass(frozen=True)
class _Job:
    """One diagnosis: the verify whose graph, samples and compiled model it reads, the thresholds its hint aims at,
    where it is written; for a precision search, which candidate and why that one."""
    verify: Action
    thresholds: dict[str, float]
    written: Path
    candidate: str | None = None
    why: str | None = None
    htp: bool = True  # False: the candidate was never compiled, the CPU half (float vs QDQ) only


def _searched(select: Action, spec_of: Callable[[str], Action]) -> _Job | None:
    """A precision search's candidate to diagnose on the select's target: the one it ships; when none passed, the
    one closest to the thresholds on the simulator, else on the CPU screen (never compiled: the CPU half only);
    None when nothing was measured. Written beside `<recipe>_search.json`."""
    from ctxbuild.verify.measure import failures
    from ctxbuild.verify.predict import measured, worst_snr

    thr = select.params["thresholds"]
    names = [c["name"] for c in select.params["candidates"]]
    results = {n: _read(select.inputs[f"{n}.result"]) for n in names}
    ran = [n for n in names if measured(results[n])]
    screens = {n: s for n in names if f"{n}.screen" in select.inputs and (s := _read(select.inputs[f"{n}.screen"]))
               and s.get("outputs")}
    if passing := [n for n in ran if not failures({**results[n], "thresholds": thr})]:
        name, why, htp = passing[0], "the search's answer", True
    elif ran:
        name, htp = max(ran, key=lambda n: worst_snr(results[n])[0]), True
        why = "no candidate passed; the closest on the simulator"
    elif screens:
        name, htp = max(screens, key=lambda n: worst_snr(screens[n])[0]), False
        why = "no candidate passed; the closest on the CPU screen"
    else:
        return None
    return _Job(spec_of(select.inputs[f"{name}.result"]), thr, layers_path(select.outputs["result"]), name,
                f"{why}, {name}" + ("" if htp else " (not compiled: the CPU half of the diagnosis)"), htp)


def _read(path: str) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):  # not written: the build stopped before it
        return None


def _samples(v: Action, limit: int | None) -> list[dict[str, Any]]:
    from ctxbuild.graph.modelio import load
    from ctxbuild.graph.inputvalues import recorded
    from ctxbuild.graph.samples import from_files, input_spec, random_samples
    from ctxbuild.actions.verify import discover_inputs
    from ctxbuild.lora.adapters import slot_defaults_of

    reference = load(Path(v.inputs["reference"]), external_data=False)
    spec = input_spec(reference)
    n = limit or v.params["samples"]
    samples = (random_samples(spec, n) if v.params["sample_source"] == "random" else
               from_files(spec, dict(list(discover_inputs(v).items())[:n]), v.recipe_files[0], recorded(reference)))
    # LoRA: the QDQ model takes the slots as inputs; the base is diagnosed with their defaults (no adapter)
    slots = slot_defaults_of(Path(v.inputs["reference"]))
    return [{**slots, **s} for s in samples]
