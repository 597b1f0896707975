"""verify_alpha: an alpha-switched binary (adapters: {switch: alpha}) on the HTP simulator, one row per alpha vector:
all zeros against the float base, each one-hot against the float base with that adapter merged into its weights
(W + s B A: the model the adapter was trained for, not the branch graph that was compiled), and the first two
adapters at 0.5 against the float mix. Every row runs through both wrappers (the float-I/O one, whose Q/DQ run on the
CPU EP, and the quantized-I/O one fed codes), which must agree, and meets verify's thresholds.

An adapter the samples cannot tell from the base (the float base already meets the thresholds against its merge:
a run that ignored it would pass) is reported as indistinguishable, with a warning, not passed: onnxruntime-qnn's
own LoRA sample warns that with all-zero inputs every adapter gives the same output.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxbuild.actions import verify
from ctxbuild.errors import ActionError
from ctxbuild.graph.inputvalues import recorded
from ctxbuild.graph.modelio import load
from ctxbuild.graph.samples import for_verification, input_spec
from ctxbuild.lora import alpha as lora_alpha
from ctxbuild.verify.measure import compare, cpu_outputs, failures, simulate

if TYPE_CHECKING:
    import numpy as np

discover_inputs = verify.discover_inputs
summarize = verify.summarize


def warnings(action: Any) -> list[str]:
    found = verify.warnings(action)
    result = Path(action.outputs["result"])
    if result.is_file():  # also on a restore: the result is the cached output
        for name in json.loads(result.read_text()).get("indistinguishable", []):
            found.append(f"{action.description}: adapter '{name}': on these samples its outputs cannot be told from "
                         "the base's (the float base already meets the thresholds against it): not verified; give "
                         "verify.dir samples the adapter changes")
    return found


def vectors(names: list[str]) -> list[tuple[str, list[float]]]:
    """(label, lora_alpha) per row: the base, each adapter alone, and the first two adapters at 0.5 each."""
    n = len(names)
    rows = [("base", [0.0] * n)] + [(name, [1.0 if j == i else 0.0 for j in range(n)]) for i, name in enumerate(names)]
    if n >= 2:
        rows.append((f"{names[0]}+{names[1]} at 0.5", [0.5, 0.5] + [0.0] * (n - 2)))
    return rows


def run(ctx: Any) -> None:
    import numpy as np

    a = ctx.action
    p = a.params
    ref_model = Path(a.inputs["reference"])
    ref_proto = load(ref_model, external_data=False)
    alpha_map = lora_alpha.read_map(ref_proto)
    assert alpha_map is not None, "prepare stamps the alpha map"
    spec = p["alpha"]
    samples = for_verification(input_spec(ref_proto), p, lambda: verify.sample_files(a), a.recipe_files[0],
                               recorded(ref_proto))
    files = {x["name"]: Path(a.inputs[f"alpha:{x['name']}"]) for x in spec["adapters"]}
    deltas = lora_alpha.deltas(alpha_map, spec, files)
    rows = vectors([x["name"] for x in spec["adapters"]])
    start = time.monotonic()
    references = [_merged_outputs(ref_model, ref_proto, deltas, alpha, samples, ctx.tmp / f"row{i}")
                  for i, (_, alpha) in enumerate(rows)]
    ctx.facts["reference_seconds"] = round(time.monotonic() - start, 3)
    name = alpha_map["input"]
    feeds = [{**s, name: np.asarray(alpha, np.float32)} for _, alpha in rows for s in samples]
    start = time.monotonic()
    got = simulate(Path(a.inputs["ctx.ctx"]), feeds, cpu_fallback=True, timeout=p["timeout_s"])
    ctx.facts["simulator_seconds"] = round(time.monotonic() - start, 3)
    ctx.facts["simulator_runs"] = len(feeds)
    twin = None
    if "ctx.ctx_qio" in a.inputs:  # the quantized-I/O wrapper of the same binary, fed the codes
        twin = simulate(Path(a.inputs["ctx.ctx_qio"]), feeds, cpu_fallback=p["cpu_fallback"], timeout=p["timeout_s"])
    k = len(samples)
    result: dict[str, Any] = {"graph": p["graph"], "method": p["method"], "samples": k,
                              "sample_source": p["sample_source"], "thresholds": p["thresholds"],
                              "alpha_map": alpha_map, "rows": [], "indistinguishable": []}
    failed = []
    for i, (label, alpha) in enumerate(rows):
        part = _per_sample(got, i, k, len(feeds))
        row: dict[str, Any] = {"row": label, "lora_alpha": alpha, "outputs": compare(references[i], part)}
        if twin is not None:
            other = _per_sample(twin, i, k, len(feeds))
            row["qio_max_abs_diff"] = max(float(np.abs(other[n] - part[n]).max()) for n in other)
        if i and label in files:  # an adapter alone: can the samples tell it from the base at all?
            base_vs = compare(references[i], references[0])
            row["base_vs_merged"] = base_vs
            if not failures({"thresholds": p["thresholds"], "outputs": base_vs}):
                result["indistinguishable"].append(label)
                row["verdict"] = "indistinguishable"
        found = failures({"thresholds": p["thresholds"], "outputs": row["outputs"]})
        row.setdefault("verdict", "failed" if found else "passed")
        failed += [f"{label} (lora_alpha {alpha}): {f}" for f in found]
        result["rows"].append(row)
    # the report's and the build summary's figures: per output the worst row (they list one line per verification)
    result["outputs"] = {n: min((r["outputs"][n] for r in result["rows"]), key=lambda m: m["snr_db"])
                         for n in result["rows"][0]["outputs"]}
    result["adapter"] = f"lora_alpha: worst of {len(rows)} rows"
    result["passed"] = not failed
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    if failed:
        raise ActionError(f"{p['graph']}@{a.target['name']}: " + "; ".join(failed[:4]), details=result,
                          hint="check the calibration samples; a mix beyond sum(lora_alpha) = 1 leaves the "
                               "calibrated range")


def _per_sample(outputs: dict[str, np.ndarray], row: int, k: int, total: int) -> dict[str, np.ndarray]:
    """Row `row`'s k samples of outputs the simulator joined over `total` runs (along the first axis)."""
    out = {}
    for n, v in outputs.items():
        per = v.shape[0] // total
        out[n] = v[row * k * per:(row + 1) * k * per]
    return out


def _merged_outputs(ref_model: Path, ref_proto: Any, deltas: list[dict[str, np.ndarray]], alpha: list[float],
                    samples: list[dict[str, np.ndarray]], d: Path) -> dict[str, np.ndarray]:
    """The float model with sum_i alpha[i] * adapter i merged into its weights, on the CPU EP (lora_alpha left at its
    default 0: the branches add nothing)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from ctxbuild.graph.external_data import tensor_array
    from ctxbuild.qnn.staging import link_data

    d.mkdir(parents=True)
    link_data(ref_model, d)
    proto = onnx.ModelProto()
    proto.CopyFrom(ref_proto)
    changed = {w for delta in deltas for w in delta}
    for t in proto.graph.initializer:
        if t.name in changed and any(alpha):
            w = tensor_array(t, ref_model).astype(np.float32)
            w = w + sum(np.float32(x) * delta[t.name] for x, delta in zip(alpha, deltas) if t.name in delta)
            t.CopyFrom(numpy_helper.from_array(w.astype(np.float32), t.name))
    onnx.save(proto, str(d / "merged.onnx"))
    return cpu_outputs(d / "merged.onnx", samples)
