"""The fix the numbers point at: where the loss is (quantization or the HTP), which nodes, and what to change
(per-channel or 16-bit weights, 16-bit activations, calibration like the real inputs, split_outputs for a weak
slice, moving nodes off the NPU). Also verify's hint on a failure, from the cheap CPU half of the diagnosis."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.verify.layerloss import Graph, cpu_side, node_losses

WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# Below this a weight tensor is coarse: uint8 per-tensor weights of the examples measure 41-44 dB, the
# PP-OCRv4 recognizer's worst 14-27 dB (outlier channels stretch one scale over the whole tensor).
WEAK_WEIGHT_DB = 30.0


def weights_per_node(model: Any, weight_snr: dict[str, float], role: int = 1) -> dict[str, float]:
    """node -> SNR of its quantized weight (role 1) or bias (role 2: int32, scale = input x weight scale)."""
    return {n.name: weight_snr[n.input[role]] for n in model.graph.node
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


def weak_slice_fix(outputs: dict[str, Any], t: dict[str, float]) -> str | None:
    weak = [f"'{o}' ({s['slice']})" for o, row in outputs.items() for side in row.values()
            for s in side.get("slices") or [] if not _passes(s, t)]
    if not weak:
        return None
    return (f"weak slice {', '.join(dict.fromkeys(weak))} of a concatenated output: compile.split_outputs: true "
            "compiles the parts as separate outputs, each with its own quantization scale")


def likely_fix(where: str, worst: list[dict[str, Any]], weights: dict[str, float] | None = None,
               biases: dict[str, float] | None = None, activation_bits: int = 8) -> str:
    """The fix the numbers point at. `weights`, `biases`: node -> SNR of its quantized weight / bias;
    `activation_bits`: what the QDQ model quantizes activations to (16: do not advise 16-bit activations)."""
    names = [n["node"] for n in worst[:3]]
    listed = ", ".join(f"{n['node']} ({n['op_type']})" for n in worst[:3]) or "none measured"
    if where == "htp":
        return (f"the QDQ model meets the thresholds on the CPU; the HTP's own arithmetic loses it, most at "
                f"{listed}: keep them in float with quantization.nodes: {{{', '.join(f'{n}: fp16' for n in names) or '<node>: fp16'}}} "
                "(the HTP runs them in fp16), or let precision: auto's mixed rung choose them")
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
    if activation_bits >= 16:  # the activations have their range already: the weights are what is left
        return (f"quantization loses it, most at {listed}, with 16-bit activations already: per-channel weights "
                f"(quantization.per_channel) or 16-bit weights for nodes {', '.join(names)}, or move them off the NPU")
    return (f"quantization loses it, most at {listed}: their activations need more range: 16-bit activations, "
            f"or overrides for nodes {', '.join(names)}, or move them off the NPU")


def failure_hint(reference: Path, compiled: Path, samples: list[dict[str, np.ndarray]],
                 float_out: dict[str, np.ndarray], result: dict[str, Any], *, recipe: str, precision: str,
                 split: bool = False) -> str:
    """verify's hint on failure: the cheap CPU half of the diagnosis (no extra compile or simulator run).
    `split`: the graph was compiled with split_outputs, so a weak slice is not cured by it."""
    from ctxbuild.verify.measure import cpu_outputs, metrics

    more = f"`ctxbuild verify --layers {recipe}` lists the worst nodes"
    weak = weak_slice_fix({n: {"htp": m} for n, m in result["outputs"].items()}, result["thresholds"])
    if weak and not split:  # one scale over slices of very different ranges: the cure is known, no diagnosis needed
        return weak
    if compiled.resolve() == reference.resolve():
        return f"the {precision} model loses accuracy on the HTP itself; {more}"
    try:
        qdq_out = cpu_outputs(compiled, samples)
        t = result["thresholds"]
        quant = {n: metrics(float_out[n], qdq_out[n]) for n in float_out if n in qdq_out}
        if all(_passes(m, t) for m in quant.values()):
            snr = min(m["snr_db"] for m in quant.values())
            return (f"the QDQ model on the CPU passes (SNR {snr:.1f} dB): the loss is on the HTP; {more} "
                    "(candidates to move off the NPU)")
        with tempfile.TemporaryDirectory(prefix="ctxbuild-hint-") as tmp:  # one sample: a hint, not the diagnosis
            cpu = cpu_side(reference, compiled, samples[:1], Path(tmp))
        from ctxbuild.graph.modelio import load

        model = load(reference, external_data=False)
        rows = list(node_losses(Graph(model), cpu.quant_snr, cpu.producer).values())
        return likely_fix("quantization", worst_nodes(rows, "added_db", 3), weights_per_node(model, cpu.weight_snr),
                          weights_per_node(model, cpu.weight_snr, role=2), cpu.activation_bits) + f"; {more}"
    except Exception as e:  # noqa: BLE001 - a hint must never hide the verification failure itself
        return f"{more} (no quick diagnosis: {type(e).__name__})"


def _passes(m: dict[str, Any], t: dict[str, float]) -> bool:
    return m["cosine"] >= t["min_cosine"] and m["snr_db"] >= t["min_snr_db"]
