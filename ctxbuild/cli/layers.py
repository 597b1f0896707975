"""`ctxbuild verify --layers RECIPE`: build and verify the recipe, then diagnose each of its verified graphs
per layer (diagnose.py), print the worst nodes and write `<graph>_layers.json` beside `<graph>_verify.json`
(the report shows it for failed graphs). With --json: one document holding every diagnosis."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action, load_spec
from ctxbuild.capture import captured
from ctxbuild.errors import UsageError
from ctxbuild.layout import STATE, layers_path, spec_name


def main(paths: list[Path], out: Path, recipe: str, targets: list[str], *, samples: int | None,
         cache_env: dict[str, str], as_json: bool) -> int:
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
                            cache_env=cache_env, set_aside_failed=False,  # the diagnosis reads the failed graph's artifacts
                            summary=False, console=Console(json=as_json)))  # the diagnosis follows instead
    if make_dry_run(os.environ.get("MAKEFLAGS", "")):  # under `make -n` the build only said what it would run
        return rc
    state = ninja.read_state(out, "plan.json") or {"actions": []}
    verifies = [load_spec(out / STATE / "actions" / spec_name(a["id"])) for a in state["actions"]
                if a["kind"] == "verify" and recipe in a["recipes"]
                and (not targets or a["target"]["name"] in targets)]
    if not verifies:
        raise UsageError(f"--layers {recipe}: the recipe has no verified graph"
                         + (f" for {', '.join(targets)}" if targets else ""), "is verification off for it?")
    by_output = {p: a for a in state["actions"] for p in a["outputs"]}
    diagnoses = []
    for v in verifies:
        compiler = load_spec(out / STATE / "actions" / spec_name(by_output[v.inputs["ctx.ctx"]]["id"]))
        if not Path(v.inputs["ctx.ctx"]).is_file():
            print(f"ctxbuild: {v.id}: nothing compiled to diagnose (the build failed before verification)",
                  file=sys.stderr)
            rc = rc or 1
            continue
        started = time.monotonic()
        log = out / STATE / "logs" / f"layers.{v.id.split('/', 1)[1]}.log"
        with captured(log):  # the EP's native logging, as for actions
            result = diagnose.diagnose(Path(v.inputs["reference"]), Path(v.inputs["compiled"]), _samples(v, samples),
                                       compiler.params, v.params["thresholds"], slices=v.params.get("slices"),
                                       delivered=Path(v.inputs["ctx.ctx"]), timeout=v.params["timeout_s"])
        result.update({"graph": v.params["graph"], "target": v.target["name"] if v.target else "",
                       "verify": v.id, "seconds": round(time.monotonic() - started, 1)})
        dst = layers_path(v.outputs["result"])
        diagnose.write(dst, result)
        diagnoses.append({**result, "written": str(dst)})
        if not as_json:
            print(diagnose.format_text(result))
            print(f"  written: {dst}")
    ship_only_verified(out, state, pending=set())  # the build left the failed graph in place for the diagnosis
    write_manifest(out, state, toolchain.summary(out / STATE))
    write_report(out)
    if as_json:
        print(json.dumps({"ok": rc == 0, "exit_code": rc, "error": None, "out": str(out), "diagnoses": diagnoses},
                         indent=2, sort_keys=True))
    return rc


def _samples(v: Action, limit: int | None) -> list[dict[str, Any]]:
    from ctxbuild.graph.modelio import load
    from ctxbuild.graph.inputvalues import recorded
    from ctxbuild.graph.samples import from_files, input_spec, random_samples
    from ctxbuild.actions.verify import discover_inputs

    reference = load(Path(v.inputs["reference"]), external_data=False)
    spec = input_spec(reference)
    n = limit or v.params["samples"]
    if v.params["sample_source"] == "random":
        return list(random_samples(spec, n))
    return list(from_files(spec, dict(list(discover_inputs(v).items())[:n]), v.recipe_files[0], recorded(reference)))
