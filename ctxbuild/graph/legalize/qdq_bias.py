"""A float bias on a quantized Conv -> the int32 bias of the QDQ format: DequantizeLinear(round(b / (sx * sw)),
scale sx * sw, zero point 0), sx the input's scale and sw the weight's (per tensor, or per output channel).
onnxruntime's quantize_static quantizes a bias only when it is an initializer: paddle2onnx writes biases in
Constant nodes, so a quantize_static PP-OCR detector keeps 52 float biases ("Expected bias ... to be an
initializer"), and QNN computes such a Conv wrongly on the HTP (its first one: cosine 0.41, values up to 2.4x too
large, against the QDQ model on the CPU EP; the Conv before it, quantized alike but with no bias: 1.0000).

The form is the documented one (ONNX QLinearConv: "Bias must be quantized using scale = x_scale * w_scale and
zero_point = 0"; onnxruntime's quantizer and its WeightBiasQuantization transformer write it so), computed as the
quantizer does: the scale is the float32 product, the quotient rounded half to even in float64. It is not exact:
each bias moves by at most half a step of the scale sx * sw, the resolution of the Conv's integer accumulator,
where the HTP adds the bias whatever form it is given in. That is far below the step of the Conv's own quantized
output, but a value on the edge of a rounding step can flip by one step, and a steep head downstream (the PP-OCR
detector's sigmoid) can make one flip large at a pixel: hence this rule's TOLERANCE (check.py) is measured in the
outputs' SNR, not their largest difference.

Only where the input's DequantizeLinear has a constant per-tensor scale, the weight's a constant scale per tensor
or along axis 0 (one per output channel), and every quantized bias fits int32."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "qdq_bias"
OPS = ("Conv",)
WHAT = "a float bias on a quantized Conv -> int32 at input scale x weight scale, zero point 0"
INT32 = np.iinfo(np.int32)
# Judged by the outputs' SNR against the model before (check.py), not their largest difference: measured on
# rendered text, the rounding moved a PP-OCR detector's outputs to 21.5 dB (max abs 0.97 of 1 at a pixel) and a
# recognizer's to 13.8 dB, about what onnxruntime's own CPU EP moves them by with its blocked (NCHWc) Conv kernels
# instead of the plain ones (28.7 and 13.3 dB); a scale misread by a factor 2 moved the detector's to 5 dB, a
# dropped bias to 0 dB (docs/legalization.md).
MIN_SNR_DB = 10.0


def wanted(g: GraphView) -> bool:
    return any(_float_bias(g, n) for n in g.graph.node if n.op_type == "Conv")


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Conv" and _float_bias(g, n)]:
        quantized = _quantized(g, node)
        if isinstance(quantized, str):
            g.keep(node, quantized)
            continue
        q, scale = quantized
        base = f"{node.input[2]}_int32"
        attrs = {"axis": 0} if scale.size > 1 else {}
        dq = g.node("DequantizeLinear", [g.add_const(base, q), g.add_const(f"{base}_scale", scale),
                                         g.add_const(f"{base}_zero_point", np.zeros(scale.shape, np.int32))],
                    f"{base}_DequantizeLinear", **attrs)
        node.input[2] = dq.output[0]
        done += 1
    return done


def _float_bias(g: GraphView, node: Any) -> bool:
    """A Conv whose input and weight are dequantized and whose bias is a float32 constant. Read from the graph
    alone: a float model's Conv biases (in external data, maybe behind a symlink onnx will not open) are never
    loaded here."""
    from onnx import TensorProto

    if len(node.input) < 3 or not node.input[2]:
        return False
    return all((p := g.producer.get(i)) is not None and p.op_type == "DequantizeLinear" for i in node.input[:2]) \
        and g.const_type(node.input[2]) == TensorProto.FLOAT


def _quantized(g: GraphView, node: Any) -> tuple[np.ndarray, np.ndarray] | str:
    """The int32 bias and its scale, or why the bias is left float."""
    x_dq, w_dq = g.producer[node.input[0]], g.producer[node.input[1]]
    sx, sw = g.const(x_dq.input[1]), g.const(w_dq.input[1])
    bias = g.const(node.input[2])
    if sx is None or sw is None or g.const(w_dq.input[0]) is None:
        return "the input's or the weight's scale, or the weight, is computed at run time"
    if sx.size != 1 or sx.dtype != np.float32 or sw.dtype != np.float32 or sw.ndim > 1 or bias.ndim != 1:
        return f"input scale {list(sx.shape)}, weight scale {list(sw.shape)}, bias {list(bias.shape)}: not folded"
    if {a.name for a in w_dq.attribute} - {"axis"} or {a.name for a in x_dq.attribute} - {"axis"}:
        return "a DequantizeLinear with opset 21's attributes (blocked forms are left)"
    if sw.size > 1 and (next((a.i for a in w_dq.attribute if a.name == "axis"), 1) != 0 or sw.size != bias.size):
        return f"weight scale of {sw.size} is not one per output channel (axis 0) of {bias.size}"
    scale = (sx.reshape(()) * sw).astype(np.float32)  # onnxruntime's quantizer: input_scale * weight_scale
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(bias.astype(np.float64) / scale.astype(np.float64))
    if not np.isfinite(q).all() or (np.abs(q) > INT32.max).any():
        return "a bias does not fit int32 at input scale x weight scale"
    return q.astype(np.int32), scale
