"""The fix the numbers point at: where the loss is (quantization or the HTP), which nodes, and what to change
(per-channel or 16-bit weights, 16-bit activations, calibration like the real inputs, split_outputs for a weak
slice, per-node overrides in quantization.nodes, fp16 for nodes without weights), and what an fp16 build's
float values hold that fp16 cannot. Also verify's hint on a failure, from the cheap CPU half of the diagnosis."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ctxbuild.graph.legalize.log_power import SCALED
from ctxbuild.graph.nodenames import Names
from ctxbuild.recipes.quantization import FP16_NODE
from ctxbuild.verify.islands import widen_lone
from ctxbuild.verify.layerloss import Graph, activations, cpu_side, node_losses

WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# Below this a weight tensor is coarse: uint8 per-tensor weights of the examples measure 41-44 dB, the
# PP-OCRv4 recognizer's worst 14-27 dB (outlier channels stretch one scale over the whole tensor).
WEAK_WEIGHT_DB = 30.0
HINT_MAX_BYTES = 256 << 20  # verify's fp16 hint runs the float model with every tensor an output up to this size


def weights_per_node(model: Any, weight_snr: dict[str, float], role: int = 1) -> dict[str, float]:
    """node (the user's name) -> SNR of its quantized weight (role 1) or bias (role 2: int32, scale = input x
    weight scale)."""
    names = Names(model)
    return {names.label(n): weight_snr[n.input[role]] for n in model.graph.node
            if n.op_type in WEIGHTED_OPS and len(n.input) > role and n.input[role] in weight_snr}


def worst_nodes(nodes: list[dict[str, Any]], key: str, top: int) -> list[dict[str, Any]]:
    ranked = [n for n in nodes if n.get(key) is not None]
    return sorted(ranked, key=lambda n: -n[key])[:top]


def where_lost(outputs: dict[str, Any], t: dict[str, float]) -> str:
    """'quantization' when the QDQ model on the CPU already misses a threshold (whole or a slice), else 'htp'."""
    for row in outputs.values():
        q = row["quantization"]
        if not all(_passes(m, t) for m in [q, *(q.get("slices") or [])]):
            return "quantization"
    return "htp"


def meets(outputs: dict[str, Any], t: dict[str, float]) -> bool:
    """Whether what was diagnosed meets the thresholds on its samples: float vs the HTP for every output and slice
    (float vs the QDQ model on the CPU where the HTP did not run)."""
    for row in outputs.values():
        m = row.get("total", row["quantization"])
        if not all(_passes(x, t) for x in [m, *(m.get("slices") or [])]):
            return False
    return True


def weak_slice_fix(outputs: dict[str, Any], t: dict[str, float]) -> str | None:
    weak = [f"'{o}' ({s['slice']})" for o, row in outputs.items() for side in row.values()
            for s in side.get("slices") or [] if not _passes(s, t)]
    if not weak:
        return None
    return (f"weak slice {', '.join(dict.fromkeys(weak))} of a concatenated output: compile.split_outputs: true "
            "compiles the parts as separate outputs, each with its own quantization scale")


def likely_fix(where: str, worst: list[dict[str, Any]], weights: dict[str, float] | None = None,
               biases: dict[str, float] | None = None, activation_bits: int = 8,
               cause: tuple[str, str] | None = None, neighbours: dict[str, str] | None = None) -> str:
    """The fix the numbers point at. `weights`, `biases`: node -> SNR of its quantized weight / bias;
    `activation_bits`: what the QDQ model quantizes activations to (0: not quantized, an fp16 build; 16: do not
    advise 16-bit activations); `cause`: what the float values show and its fix (fp16_cause), said first;
    `neighbours`: node -> the neighbour an fp16 pin of it needs (verify/islands.widen_lone), pinned with it."""
    names = [n["node"] for n in worst[:3]]
    listed = ", ".join(f"{n['node']} ({n['op_type']})" for n in worst[:3]) or "none measured"
    weighted = [n["node"] for n in worst[:3] if n["op_type"].split("+")[0] in WEIGHTED_OPS]
    weightless = [n for n in names if n not in weighted]
    if where == "htp":
        if activation_bits == 0:
            return (f"{cause[0]}: {cause[1]}; the HTP's fp16 arithmetic loses it, most at {listed}" if cause else
                    f"the HTP's fp16 arithmetic loses it, most at {listed}, no value leaving fp16's range: "
                    f"{FP16_ROUNDING_FIX}")
        fix = (f"16-bit activations on them ({_nodes_field(names, 'activations: uint16')})" if activation_bits < 16
               else "they have 16-bit activations already: keep them in float, the HTP runs them in fp16 ("
               + _fp16_field(names, neighbours or {}) + ")")
        if weighted:
            fix += f", 16-bit weights ({_nodes_field(weighted, 'weights: int16')})"
        return (f"the QDQ model meets the thresholds on the CPU; the HTP's own arithmetic loses it, most at "
                f"{listed}: {fix}")
    clipped = sorted((snr, node) for node, snr in (biases or {}).items() if snr < WEAK_WEIGHT_DB)
    if clipped:  # a bias's int32 scale is input scale x weight scale: a too-narrow input range clips it
        shown = ", ".join(f"{node} {snr:.0f} dB" for snr, node in clipped[:3])
        return (f"quantization loses it: the biases of {shown} do not fit their int32 scale (input scale x weight "
                f"scale): the calibration samples cover a narrower range than the inputs verified on; calibrate on "
                f"inputs like the real ones (the noise grows most at {listed})")
    coarse = sorted((snr, node) for node, snr in (weights or {}).items() if snr < WEAK_WEIGHT_DB)
    if coarse:
        shown = ", ".join(f"{node} {snr:.0f} dB" for snr, node in coarse[:3])
        return (f"quantization loses it: {len(coarse)} weight tensor(s) keep less than {WEAK_WEIGHT_DB:.0f} dB "
                f"(worst: {shown}): use per-channel weights or 16-bit weights; the noise grows most at {listed} "
                f"(candidates for 16-bit overrides)")
    said = f"{cause[0]}; " if cause else ""
    if activation_bits >= 16:  # the activations have their range already: the weights are what is left
        fixes = []
        if weighted:
            fixes.append(f"per-channel weights (quantization.per_channel) or 16-bit weights for "
                         f"{_nodes_field(weighted, 'weights: int16')}")
        if weightless:  # no weights to widen: 16-bit weights would change nothing there
            fixes.append(f"{', '.join(weightless)} have no weights: fp16 keeps their range, for them alone "
                         f"({_fp16_field(weightless, neighbours or {})}) or the whole model (precision: fp16)")
        return f"{said}quantization loses it, most at {listed}, with 16-bit activations already: {'; '.join(fixes)}"
    return (f"{said}quantization loses it, most at {listed}: their activations need more range: 16-bit activations "
            f"(quantization.activations: uint16, or for these nodes {_nodes_field(names, 'activations: uint16')})")


def fp16_neighbours(model: Any, worst: list[dict[str, Any]], added: str) -> dict[str, str]:
    """node -> the neighbour an fp16 pin of it needs (verify/islands.widen_lone), for the first three of `worst`
    (the nodes likely_fix may keep in float), the neighbour the rows' `added` figure rates worst first."""
    return widen_lone(model, {r["node"]: FP16_NODE for r in worst[:3]}, worst, added)[1]


def _fp16_field(names: list[str], neighbours: dict[str, str]) -> str:
    """quantization.nodes keeping these nodes in float, each with the neighbour it needs (a weightless node between
    quantized ones alone runs quantized: the pin would change nothing), and why those are there."""
    pinned = list(dict.fromkeys(m for n in names for m in (n, neighbours.get(n)) if m))
    why = "".join(f"; {neighbours[n]} with {n}, which alone between quantized nodes would run quantized"
                  for n in names if n in neighbours)
    return "quantization.nodes: {" + ", ".join(f"'{n}': fp16" for n in pinned) + "}" + why


def _nodes_field(names: list[str], what: str) -> str:
    """The recipe field that sets `what` on these nodes alone: quantization.nodes, by the model's node names."""
    return "quantization.nodes: {" + ", ".join(f"'{n}': {{{what}}}" for n in names) + "}"


FP16_MAX = 65504.0  # the largest finite float16
FP16_NORMAL = 2.0 ** -14  # the smallest normal float16: the HTP flushes products below it to 0 (measured)
FP16_FIX = "build at w8a16 (precision: w8a16), whose scale follows the values where fp16's range is fixed"
SCALED_FIX = ("what is left is the quietest bins, floored: if they do not matter, lower verify.min_snr_db "
              "(precision: auto verifies at 20 dB)")
# The values fit: no one integer candidate is known to do better (PP-OCRv6's recognizer fails at fp16, 18.7 dB, and
# at w8a16 too, 8.1 dB on the CPU; w16a16 passes, 27.2 dB): the search measures which does
FP16_ROUNDING_FIX = ("precision: auto verifies the integer candidates (16-bit activations with 8- or 16-bit weights, "
                     "mixed precision) and keeps the first that passes")
LOG_FIX = ("scale the Log's input into fp16's range and subtract the scale's log after it (prepare's log_power rule "
           "does this for a floored power spectrum; its record says why it did not apply)")


def fp16_cause(model: Any, float_acts: dict[str, list[np.ndarray]], among: list[str]) -> tuple[str, str] | None:
    """What the float model's own values show fp16 cannot hold, on one line, and the fix; or None: the first node
    (in the graph's order) whose values pass 65504 or that takes the Log of values below fp16's normal range, else
    a node of `among` reading an infinite or huge constant."""
    from onnx import numpy_helper

    names = Names(model)  # the user's names for the nodes prepare rewrote
    consts = {i.name: i for i in model.graph.initializer}
    consts.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute
                   if a.name == "value"})
    producer = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        if n.op_type == "Log" and (low := _least(float_acts.get(n.input[0], []))) is not None and low < FP16_NORMAL:
            if n.doc_string == SCALED:  # the log_power rule's own Log: scaled already, its zeros floored
                return (f"fp16 underflow: {names.label(n)} (Log) reads values down to {low:.3g} in float even "
                        f"scaled into fp16's range by prepare's log_power rule: the spectrum spans more than fp16 "
                        f"holds"), SCALED_FIX
            return (f"fp16 underflow: {names.label(n)} (Log) reads values down to {low:.3g} in float"
                    f"{_zero_floor(producer.get(n.input[0]), consts, names.label)}; the HTP flushes values under {FP16_NORMAL:.2g} "
                    "to 0 and its Log(0) is -7.6, not -inf"), LOG_FIX
        for o in n.output:
            values = [np.asarray(v) for v in float_acts.get(o, []) if np.asarray(v).dtype.kind == "f"]
            top = max((float(np.abs(v[np.isfinite(v)]).max(initial=0)) for v in values), default=0.0)
            if top > FP16_MAX:
                return (f"fp16 overflow: {names.label(n)} ({n.op_type}) computes values up to {top:.3g} in float, beyond "
                        f"fp16's {FP16_MAX:g}"), FP16_FIX
    for n in model.graph.node:
        if names.label(n) not in among:
            continue
        for i in n.input:
            value = numpy_helper.to_array(consts[i]) if i in consts else None
            if value is not None and value.dtype.kind == "f" and value.size and \
                    (not np.isfinite(value).all() or float(np.abs(value).max()) > FP16_MAX):
                flat = value.ravel().astype(np.float64)
                shown = flat[np.argmax(np.where(np.isnan(flat), 0, np.abs(flat)))]
                return (f"{names.label(n)} ({n.op_type}) reads the constant {i} = "
                        f"{float(shown):g}, beyond fp16's {FP16_MAX:g}"), FP16_FIX
    return None


def _least(values: list[np.ndarray]) -> float | None:
    """The smallest magnitude among finite float values (a Log's input: its positive range), or None."""
    found = [np.abs(v[np.isfinite(v)]) for v in map(np.asarray, values) if v.dtype.kind == "f" and v.size]
    return min((float(v.min()) for v in found if v.size), default=None)


def _zero_floor(floor: Any, consts: dict[str, Any], label: Callable[[Any], str]) -> str:
    """', its floor F (Clip)'s min 1e-10 is 0 in fp16' when the Log reads a Clip/Max by a constant fp16 rounds to 0."""
    from onnx import numpy_helper

    if floor is None or floor.op_type not in ("Clip", "Max"):
        return ""
    for i in floor.input[1:] if floor.op_type == "Clip" else floor.input:
        value = numpy_helper.to_array(consts[i]) if i in consts else None
        if value is not None and value.size == 1 and 0 < float(value.item()) and np.float16(value.item()) == 0:
            return f" ({label(floor)} ({floor.op_type}) floors them at {float(value.item()):g}, 0 in fp16)"
    return ""


def failure_hint(reference: Path, compiled: Path, samples: list[dict[str, np.ndarray]],
                 float_out: dict[str, np.ndarray], result: dict[str, Any], *, recipe: str, precision: str,
                 split: bool = False) -> str:
    """verify's hint on failure: the cheap CPU half of the diagnosis (no extra compile or simulator run).
    `split`: the graph was compiled with split_outputs, so a weak slice is not cured by it."""
    from ctxbuild.verify.measure import cpu_outputs, metrics

    more = f"`ctxbuild verify --layers {recipe}` lists the worst nodes"
    weak = weak_slice_fix({n: {"htp": m} for n, m in result["outputs"].items()}, result["thresholds"])
    if weak and not split and precision != "fp16":  # one scale over slices of very different ranges: the cure is
        return weak  # known, no diagnosis needed. fp16 has no scale: each value keeps its exponent in the Concat
    if compiled.resolve() == reference.resolve():
        found = _float_cause(reference, samples[:1]) if precision == "fp16" else None
        if found:
            return f"the {precision} model loses accuracy on the HTP itself: {found[0]}: {found[1]}; {more}"
        return f"the {precision} model loses accuracy on the HTP itself; {more}"
    try:
        qdq_out = cpu_outputs(compiled, samples)
        t = result["thresholds"]
        quant = {n: metrics(float_out[n], qdq_out[n]) for n in float_out if n in qdq_out}
        if all(_passes(m, t) for m in quant.values()):
            snr = min(m["snr_db"] for m in quant.values())
            return (f"the QDQ model on the CPU passes (SNR {snr:.1f} dB): the loss is on the HTP; {more} "
                    "(its nodes are candidates for quantization.nodes overrides)")
        with tempfile.TemporaryDirectory(prefix="ctxbuild-hint-") as tmp:  # one sample: a hint, not the diagnosis
            cpu = cpu_side(reference, compiled, samples[:1], Path(tmp))
        from ctxbuild.graph.modelio import load

        model = load(reference, external_data=False)
        rows = list(node_losses(Graph(model), cpu.quant_snr, cpu.producer).values())
        worst = worst_nodes(rows, "added_db", 3)
        return likely_fix("quantization", worst, weights_per_node(model, cpu.weight_snr),
                          weights_per_node(model, cpu.weight_snr, role=2), cpu.activation_bits,
                          neighbours=fp16_neighbours(model, worst, "added_db")) + f"; {more}"
    except Exception as e:  # noqa: BLE001 - a hint must never hide the verification failure itself
        return f"{more} (no quick diagnosis: {type(e).__name__})"


def _float_cause(reference: Path, samples: list[dict[str, np.ndarray]]) -> tuple[str, str] | None:
    """fp16_cause from one CPU run of the float model with every tensor an output; None for a model over
    HINT_MAX_BYTES (a hint must not cost an LLM's worth of activations) or when the run fails."""
    from ctxbuild.graph.modelio import external_data_files, load

    model = load(reference, external_data=False)
    size = reference.stat().st_size + sum(p.stat().st_size for p in external_data_files(model, reference).values())
    if size > HINT_MAX_BYTES:
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="ctxbuild-hint-") as tmp:
            acts = activations(reference, samples, Path(tmp), "float")
    except Exception:  # noqa: BLE001 - a hint must never hide the verification failure itself
        return None
    return fp16_cause(model, acts, [])


def _passes(m: dict[str, Any], t: dict[str, float]) -> bool:
    return m["cosine"] >= t["min_cosine"] and m["snr_db"] >= t["min_snr_db"]
