"""culprits: the precision search's mixed-precision rung, decided. Runs only when some target still needs it
(every quantization candidate before it failed there: its `need` gate). Picks the base candidate (the first
the HTP measured; else the best on the CPU screen), runs the per-node diagnosis of its QDQ model on that
target (verify/diagnose.py: float vs QDQ on the CPU, HTP simulator vs QDQ on the CPU) and writes the mixed
candidate's settings: the base's, with quantization.nodes keeping the blamed nodes at higher precision
(verify/culprits.py). The file is also the gate of the mixed candidate's quantize and screen (verify/gates.py)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ctxbuild.actions import verify
from ctxbuild.actions.search_step import known
from ctxbuild.graph.modelio import load
from ctxbuild.graph.samples import for_verification, input_spec
from ctxbuild.plan.action import Action
from ctxbuild.verify import gates
from ctxbuild.verify.culprits import node_overrides
from ctxbuild.verify.ladder import state_of, walk

discover_inputs = verify.discover_inputs  # the samples the candidates' verifies read


def run(ctx: Any) -> None:
    a = ctx.action
    p = a.params
    if gates.closed(a.inputs):
        ctx.tmp_output("gate").write_text(gates.content(False))
        print(f"{a.id}: not needed by the precision search (an earlier candidate decided it)")
        return
    screens = known(a.inputs, "screen.", p["bases"])
    picked = pick(p, screens, a.inputs)
    if picked is None:  # every candidate before it was refused by QNN: nothing measured to diagnose
        ctx.tmp_output("gate").write_text(gates.content(False))
        print(f"{a.id}: no candidate before it was measured: nothing to diagnose")
        return
    target, base = picked
    graph = load(Path(a.inputs["reference"]), external_data=False)
    spec = input_spec(graph)
    samples = for_verification(spec, p, lambda: verify.sample_files(a), a.recipe_files[0])[:p["diagnose_samples"]]
    from ctxbuild.verify.diagnose import diagnose

    started = time.monotonic()
    d = diagnose(Path(a.inputs["reference"]), Path(a.inputs[f"model.{base}"]), samples,
                 {"provider_options": p["provider_options"][target]}, p["thresholds"], slices=p.get("slices"),
                 timeout=p["timeout_s"])
    settings = p["settings"][base]
    outputs = {o.name for o in graph.graph.output}
    ends = {o: n.name for n in graph.graph.node for o in n.output if o in outputs}  # output -> its node
    nodes = node_overrides(d, settings, ends, int16_weights=target not in p["no_int16_weights"])
    ctx.facts.update(diagnose_seconds=round(time.monotonic() - started, 1))
    decided = {"run": nodes != settings["nodes"], "base": base, "target": target, "where": d["where"],
               "quantization": {**settings, "nodes": nodes},
               "blamed": sorted(set(nodes) - set(settings["nodes"])),
               "worst": d["worst_htp" if d["where"] == "htp" else "worst_quantization"],
               "outputs": d["outputs"], "samples": d["samples"]}
    print(f"{a.id}: base {base}, loss mostly in {d['where']} on {target}; keeping at higher precision: "
          + ", ".join(f"{n} ({nodes[n]})" for n in decided["blamed"]))
    ctx.tmp_output("gate").write_text(json.dumps(decided, indent=2, sort_keys=True))


def pick(p: dict[str, Any], screens: dict[str, Any], inputs: dict[str, str]) -> tuple[str, str] | None:
    """(target, base): the first target whose walk reaches the mixed rung, and on it the first candidate the
    HTP measured (failed there), else the one the CPU screen measured best."""
    for target, ladder in p["ladders"].items():
        rows = walk(ladder, screens, known(inputs, f"verify.{target}.", ladder), p["thresholds"], p["predict"])
        if state_of(rows, p["candidate"]) != "pending":
            continue
        failed = [r["name"] for r in rows if r["state"] == "failed"]
        if failed:
            return target, failed[0]
        measured = [n for n in p["bases"] if n in ladder and not screens[n].get("error") and screens[n].get("outputs")]
        if measured:
            return target, max(measured, key=lambda n: min(m["snr_db"] for m in screens[n]["outputs"].values()))
    return None


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["gate"]).read_text())}
