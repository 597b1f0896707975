"""verify_adapter: a compiled LoRA base with one adapter bound, on the HTP simulator, against the float model
with that adapter, with verify's metrics and thresholds (actions/verify.py; "no adapter" is a plain verify).

An adapter outside the calibration set can leave the base's activation encodings: then the result names
the tensors whose float values fall outside their quantization range with this adapter (measured on the
float model with onnxruntime.quantization.qdq_loss_debug, against the Q nodes of the quantized model).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxbuild.lora.adapters import bind_param, read_onnx_adapter, wrapper_slot_spec
from ctxbuild.errors import ActionError
from ctxbuild.recipes import precisions
from ctxbuild.actions import verify
from ctxbuild.verify.measure import compare, cpu_outputs, failures, simulate
from ctxbuild.graph.external_data import onnx_readable
from ctxbuild.graph.modelio import load
from ctxbuild.graph.inputvalues import recorded
from ctxbuild.graph.nodenames import Names
from ctxbuild.graph.samples import for_verification, input_spec

if TYPE_CHECKING:  # imported where used: a cache hit needs no numpy
    import numpy as np

# A value counts as clipped when it lies beyond its encoding's range by more than half a quantization step.
CLIP_STEPS = 0.5

discover_inputs = verify.discover_inputs
warnings = verify.warnings
summarize = verify.summarize


def run(ctx: Any) -> None:
    a = ctx.action
    p = a.params
    ref_model = Path(a.inputs["reference"])
    ref_proto = load(ref_model, external_data=False)
    spec = input_spec(ref_proto)  # the slots are initializers there: not listed
    samples = for_verification(spec, p, lambda: verify.sample_files(a), a.recipe_files[0], recorded(ref_proto))
    binding = Path(a.inputs["binding"])
    bound = read_onnx_adapter(binding)
    if "adapter" in a.inputs:  # compile.quantized_io: the binding is quantized; the float model takes the file's values
        bound = _float_values(Path(a.inputs["ctx.ctx"]), Path(a.inputs["adapter"]), p["bind"], set(bound))
    feeds = [{**s, **bound} for s in samples]
    reference = cpu_outputs(ref_model, feeds)
    start = time.monotonic()
    got = simulate(Path(a.inputs["ctx.ctx"]), samples, cpu_fallback=p["cpu_fallback"],
                          timeout=p["timeout_s"], adapter=binding)
    ctx.facts["simulator_seconds"] = round(time.monotonic() - start, 3)
    clipping = (clipped_tensors(ref_model, Path(a.inputs["compiled"]), feeds, bound, ctx.tmp)
                if precisions.quantized(p["precision"]) else [])
    result: dict[str, Any] = {
        "graph": p["graph"], "adapter": p["adapter"], "calibrated": p["calibrated"], "method": p["method"],
        "samples": len(samples), "sample_source": p["sample_source"], "thresholds": p["thresholds"],
        "outputs": compare(reference, got),
        "coverage": verify.coverage(Path(a.inputs["ctx.ctx"]), Path(a.inputs["compiled"])),
        "clipping": clipping,
    }
    failed = failures(result)
    result["passed"] = not failed
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    if failed:
        clipped = ", ".join(f"'{c['tensor']}' ({c['fraction']:.1%} of values)" for c in clipping[:6])
        hint = (f"the adapter does not fit the base's encodings: {clipped} clip; add it to adapters.calibrate"
                if clipping else "check the calibration samples and adapters.calibrate")
        raise ActionError(f"{p['graph']} with adapter '{p['adapter']}'@{a.target['name']}: " + "; ".join(failed),
                          details=result, hint=hint)


def _float_values(wrapper: Path, adapter: Path, bind: dict[str, Any], slots: set[str]) -> dict[str, np.ndarray]:
    """The adapter file's float values for `slots`, bound as the adapter action bound them (before quantizing)."""
    import onnx

    values = bind_param(adapter, wrapper_slot_spec(onnx.load(str(wrapper), load_external_data=False)), bind)
    return {k: v for k, v in values.items() if k in slots}


def encodings(qdq_model: Path) -> dict[str, tuple[float, float, float]]:
    """Float tensor -> (low, high, step) its QuantizeLinear node can represent, from the quantized model."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = load(qdq_model, external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, tuple[float, float, float]] = {}
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in inits or len(n.input) < 3:
            continue
        scale = numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)
        zp_t = inits[n.input[2]]
        info = np.iinfo(onnx.helper.tensor_dtype_to_np_dtype(zp_t.data_type))
        zp = numpy_helper.to_array(zp_t).astype(np.float64)
        if scale.size != 1:
            continue  # per-channel activations do not occur in QNN's QDQ configs
        out[n.input[0]] = (float((info.min - zp) * scale), float((info.max - zp) * scale), float(scale))
    return out


def clipped_tensors(reference: Path, qdq_model: Path, feeds: list[dict[str, np.ndarray]],
                    bound: dict[str, np.ndarray], tmp: Path) -> list[dict[str, Any]]:
    """Tensors of the float model (and the adapter's own slot values) outside their encoding's range, by the user's
    names (graph/nodenames.py)."""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization.qdq_loss_debug import collect_activations, modify_model_output_intermediate_tensors

    ranges = encodings(qdq_model)
    # The debugger reads its input through onnx's loader and writes scratch files beside it
    augmented = tmp / "augmented.onnx"
    with onnx_readable(reference, f".clip-input-{os.getpid()}.onnx") as src:
        graph = load(src, external_data=False)
        ops = sorted({n.op_type for n in graph.graph.node})
        modify_model_output_intermediate_tensors(str(src), str(augmented), op_types_for_saving=ops)
    names = Names(graph)  # a tensor prepare (or the LLM split) renamed: by the user's name
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # collect_activations' default
    so.log_severity_level = 3  # the slots are overridable initializers: ORT warns about each
    collected = collect_activations(str(augmented), feeds, session_options=so)
    values = {k: np.concatenate([v.ravel() for v in vs]) for k, vs in collected.items()}
    values.update({k: v.ravel() for k, v in bound.items()})
    out = []
    for name, (lo, hi, step) in sorted(ranges.items()):
        v = values.get(name)
        if v is None or v.size == 0:
            continue
        outside = (v < lo - CLIP_STEPS * step) | (v > hi + CLIP_STEPS * step)
        if outside.any():
            out.append({"tensor": names.user_tensor(name), "fraction": round(float(outside.mean()), 6),
                        "range": [lo, hi], "min": float(v.min()), "max": float(v.max())})
    return sorted(out, key=lambda c: -c["fraction"])
