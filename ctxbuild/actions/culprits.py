"""culprits: the precision search's mixed-precision rung, decided. Runs only when some target still needs it
(every quantization candidate before it failed there: its `need` gate). Picks the base candidate (the first
the HTP measured; else the best on the CPU screen), runs the per-node diagnosis of its QDQ model on that
target (verify/diagnose.py: float vs QDQ on the CPU, HTP simulator vs QDQ on the CPU) and writes the mixed
candidate's settings: the base's, with quantization.nodes keeping the blamed nodes at higher precision
(verify/culprits.py). Where the base's QDQ model already fails on the CPU, or passes there by less than the CPU
screen's margin, the loss is quantization's: the diagnosis runs its CPU half only, and the set grows in rounds,
each quantized and measured on the CPU on the verification samples, until it clears the thresholds by the CPU
screen's margin or reaches its bound (verify/grow.py); the simulator then verifies the answer once, as the mixed candidate. The file is also the
gate of the mixed candidate's quantize and screen (verify/gates.py).

A diagnosis that fails (onnxruntime, the quantizer or the simulator raising on this model) closes the gate with
one line saying why (`diagnosis_failed`), which the search table shows as the mixed row's note: the ladder goes
on to the fp16 rung, so a model that passes at fp16 never fails at auto for a rung it could not decide. Only a
fault of the machine (a full disk, memory) still fails the action."""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

from ctxbuild.actions import verify
from ctxbuild.actions.quantize import private_input, quantize_model
from ctxbuild.actions.search_step import known
from ctxbuild.errors import cause_line, machine_limit
from ctxbuild.graph.modelio import load
from ctxbuild.graph.nodenames import Names
from ctxbuild.graph.inputvalues import recorded
from ctxbuild.graph.samples import for_verification, from_files, input_spec, list_samples, random_samples
from ctxbuild.plan.action import Action
from ctxbuild.verify import gates
from ctxbuild.verify import slices as output_slices
from ctxbuild.verify.culprits import htp_only, node_overrides
from ctxbuild.verify.grow import grow
from ctxbuild.verify.islands import widen_lone
from ctxbuild.verify.ladder import state_of, walk
from ctxbuild.verify.measure import compare, cpu_outputs, metrics
from ctxbuild.verify.predict import cpu_rejection, int16_weights_fail_on_htp, measured


def discover_inputs(action: Action) -> dict[str, Path]:
    """The samples the candidates' verifies read, and the calibration samples the growing rounds quantize
    with (the last watched directory, when the graph has one)."""
    found = verify.discover_inputs(action)
    cal = action.params["calibration"]
    if cal["dir"]:
        found.update({f"calibration.{k}": f for k, f in
                      list_samples(Path(action.watch[-1]), cal["samples"], action.recipe_files[0]).items()})
    return found


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
    try:
        decided = _decide(ctx, target, base, screens)
    except Exception as e:  # noqa: BLE001 - onnxruntime's, the quantizer's and the simulator's are untyped
        if isinstance(e, MemoryError) or machine_limit(e):
            raise
        traceback.print_exc()  # the whole story stays in the action's log
        why = f"not run: the diagnosis of {a.recipes[0]} at {base} on {target} failed: {cause_line(e)}"
        print(f"{a.id}: {why}; the search goes on without the mixed candidate")
        ctx.facts["diagnosis_failed"] = why
        ctx.tmp_output("gate").write_text(json.dumps({"run": False, "diagnosis_failed": why}, sort_keys=True))
        return
    ctx.tmp_output("gate").write_text(json.dumps(decided, indent=2, sort_keys=True))


def warnings(action: Action) -> list[str]:
    """A failed diagnosis: the search went on without the mixed candidate."""
    why = json.loads(Path(action.outputs["gate"]).read_text()).get("diagnosis_failed")
    return [f"{action.description}: {why}"] if why else []


def _decide(ctx: Any, target: str, base: str, screens: dict[str, Any]) -> dict[str, Any]:
    """The mixed candidate's gate: the base's settings with the nodes the diagnosis (and the growing rounds)
    keep at higher precision, and the figures behind them."""
    a = ctx.action
    p = a.params
    thr = p["thresholds"]
    # the base's QDQ model does not clear the thresholds on the CPU by the screen's margin: quantization leaves the
    # HTP no room, the loss is quantization's and the CPU half says where (PP-OCR's direction classifier: CPU
    # 20.2 dB, simulator 19.3 dB; the diagnosis' 2 samples read the HTP's own noise at 40.9 dB)
    margin = p["predict"]["cpu_margin_db"]
    cpu_only = cpu_rejection(screens[base], thr, -margin) is not None
    graph = load(Path(a.inputs["reference"]), external_data=False)
    spec = input_spec(graph)
    samples = for_verification(spec, p, lambda: verify.sample_files(a), a.recipe_files[0], recorded(graph))
    from ctxbuild.verify.diagnose import diagnose

    started = time.monotonic()
    d = diagnose(Path(a.inputs["reference"]), Path(a.inputs[f"model.{base}"]), samples[:p["diagnose_samples"]],
                 {"provider_options": p["provider_options"][target]}, thr, slices=p.get("slices"),
                 timeout=p["timeout_s"], htp=not cpu_only, fusions=False)
    if cpu_only:
        d["where"] = "quantization"  # as the screen measured it on every verification sample
    names = Names(graph)  # the answer speaks the user's node names (prepare's rewrites mapped back)
    settings = {**p["settings"][base], "nodes": names.canonical(p["settings"][base]["nodes"])}
    outputs = {o.name for o in graph.graph.output}
    ends = {o: names.label(n) for n in graph.graph.node for o in n.output if o in outputs}  # output -> its node
    verified = {n: v for t, ladder in p["ladders"].items() for n, v in known(a.inputs, f"verify.{t}.", ladder).items()
                if measured(v)}
    no_wide = int16_weights_fail_on_htp(verified, screens, p["settings"], thr)
    wide = target not in p["no_int16_weights"] and not no_wide
    nodes = node_overrides(d, settings, ends, int16_weights=wide, margin_db=margin)
    worst, added = ("worst_htp", "htp_added_db") if d["where"] == "htp" else ("worst_quantization", "quant_added_db")
    ctx.facts.update(diagnose_seconds=round(time.monotonic() - started, 1))
    grown: dict[str, Any] = {}
    widened: dict[str, str] = {}
    if d["where"] != "quantization":
        # a lone fp16 pin would leave the candidate the base to the byte (a verify measuring the base again): it
        # takes a neighbour along. Not before the growing rounds: each is measured, and the neighbour in fp16 took
        # the place of the 16-bit weights the rounds give it (the YOLOv8 detector's rounds ended at 21.4 dB, not
        # 25.2, its SPPF Conv pinned fp16 beside its SiLU's Mul)
        nodes, widened = widen_lone(graph, nodes, d[worst], added)
        for pin, near in widened.items():
            print(f"{a.id}: {pin} alone in fp16 changes nothing (its neighbours are quantized): {near} kept in fp16 "
                  "with it")
    else:
        started = time.monotonic()
        nodes, rounds, short = grow(graph, nodes, _failing(screens[base], thr, margin), wide and _wide(settings),
                                    _measure(ctx, settings, samples), thr, margin)
        grown = {"rounds": rounds, **({"stopped": short} if short else {})}
        ctx.facts.update(grow_seconds=round(time.monotonic() - started, 1), rounds=len(rounds))
        for r in rounds:
            print(f"{a.id}: round {r['round']}: +{len(r['added'])} nodes ({r['fp16']} fp16, {r['int16_weights']} "
                  f"16-bit weights): {r['where']} {r['snr_db']} dB, cosine {r['cosine']} on the CPU")
        if short:
            print(f"{a.id}: {short}")
    decided = {"run": nodes != settings["nodes"], "base": base, "target": target, "where": d["where"],
               "quantization": {**settings, "nodes": nodes},
               "blamed": sorted(set(nodes) - set(settings["nodes"])),
               "worst": d[worst], "outputs": d["outputs"], "samples": d["samples"], **grown,
               **({"widened": widened} if widened else {}),
               **({"int16_weights_fail_on_htp": no_wide} if no_wide else {})}
    if no_wide:
        print(f"{a.id}: {no_wide}")
    simulated = known(a.inputs, f"verify.{target}.", [base]).get(base)
    if line := htp_only(d, base, margin, screens[base], simulated if measured(simulated) else None, widened):
        decided["htp_only"] = line
        print(f"{a.id}: {line}")
    print(f"{a.id}: base {base}, loss mostly in {d['where']} on {target}; keeping {len(decided['blamed'])} nodes at "
          "higher precision: " + ", ".join(f"{n} ({nodes[n]})" for n in decided["blamed"][:8])
          + (", ..." if len(decided["blamed"]) > 8 else ""))
    return decided


def _wide(settings: dict[str, Any]) -> bool:
    """16-bit weights are the growing rounds' fix: 16-bit activations and 8-bit weights (verify/culprits.py)."""
    return settings["weights"] != "int16" and settings["activations"] == "uint16"


def _failing(screen: dict[str, Any], thr: dict[str, float], margin_db: float) -> set[str]:
    """The outputs the base's CPU screen measured short of the thresholds plus `margin_db` (whole or a slice);
    every output when none is."""
    out = {o for o, m in screen.get("outputs", {}).items() if cpu_rejection({"outputs": {o: m}}, thr, -margin_db)}
    return out or set(screen.get("outputs", {}))


def _measure(ctx: Any, settings: dict[str, Any], samples: list[Any]) -> Any:
    """quantization.nodes -> the CPU screen's result of the base quantized with them (a temporary QDQ model,
    calibrated as the mixed candidate's quantize calibrates)."""
    a, p = ctx.action, ctx.action.params
    reference = Path(a.inputs["reference"])
    proto = load(reference, external_data=False)
    cal = p["calibration"]
    calibration = list(random_samples(input_spec(proto), cal["samples"]) if cal["random"] else from_files(
        input_spec(proto), {k: v for k, v in discover_inputs(a).items() if k.startswith("calibration.")}, a.recipe_files[0],
        recorded(proto)))
    float_out = cpu_outputs(reference, samples)
    count = iter(range(1 << 30))

    def measure(nodes: dict[str, Any]) -> dict[str, Any]:
        dst = ctx.tmp / f"round{next(count)}" / "quantized.onnx"
        dst.parent.mkdir(parents=True)
        with private_input(reference) as src:
            quantize_model(src, dst, {**settings, "nodes": nodes}, calibration, a.recipe_files[0], proto)
        got = cpu_outputs(dst, samples)
        result = {"outputs": compare(float_out, got)}
        output_slices.annotate(result["outputs"], proto, p.get("slices"), float_out, got, metrics)
        return result

    return measure


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
