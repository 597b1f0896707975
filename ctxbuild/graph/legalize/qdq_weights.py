"""QuantizeLinear of a constant -> the quantized constant itself: onnxruntime's quantize_static quantizes weights
held in Constant nodes (paddle2onnx exports keep them there) with a QuantizeLinear at run time, which QNN takes
as a dynamic tensor: its BatchNorm refuses a dynamic scale. A weight is a constant behind DequantizeLinear.

The constant is what onnxruntime's QuantizeLinear computes: saturate(round_half_even(x / scale) + zero_point) in
float32, per tensor or along `axis`. Only float32 inputs and 8/16-bit integer zero points (float8 and opset 21's
blocked and output_dtype forms are left)."""
from __future__ import annotations

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "qdq_weights"
OPS = ("QuantizeLinear",)
WHAT = "QuantizeLinear of a constant (weights in Constant nodes) -> its quantized constant"
INTEGERS = (np.int8, np.uint8, np.int16, np.uint16)


def wanted(g: GraphView) -> bool:
    constants = {o for n in g.graph.node if n.op_type == "Constant" for o in n.output} | set(g.inits)
    return any(n.op_type == "QuantizeLinear" and n.input[0] in constants for n in g.graph.node)


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "QuantizeLinear"]:
        x = g.const(node.input[0])
        if x is None:
            continue
        q = _quantized(g, node, x)
        if isinstance(q, str):
            g.keep(node, q)
            continue
        g.replace_uses(node.output[0], g.add_const(f"{node.output[0]}_const", q))
        done += 1
    return done


def _quantized(g: GraphView, node, x: np.ndarray) -> np.ndarray | str:
    """The node's output for constant `x`, or why it is left to run."""
    attrs = {a.name: a for a in node.attribute}
    if set(attrs) - {"axis"}:
        return f"attributes {sorted(set(attrs) - {'axis'})} (only per-tensor and per-axis forms are folded)"
    if x.dtype != np.float32:
        return f"input is {x.dtype}, not float32"
    scale = g.const(node.input[1])
    zero = g.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(scale.shape, np.uint8) \
        if scale is not None else None
    if scale is None or zero is None:
        return "scale or zero point is computed at run time"
    if zero.dtype.type not in INTEGERS or scale.dtype != np.float32 or zero.shape != scale.shape or scale.ndim > 1:
        return f"zero point {zero.dtype}{list(zero.shape)}, scale {scale.dtype}{list(scale.shape)}: not folded"
    if scale.size > 1:  # per axis: scale and zero point run along `axis`
        axis = attrs["axis"].i if "axis" in attrs else 1
        if not -x.ndim <= axis < x.ndim or x.shape[axis] != scale.size:
            return f"per-axis scale of {scale.size} does not match axis {axis} of {list(x.shape)}"
        view = [1] * x.ndim
        view[axis] = scale.size
        scale, zero = scale.reshape(view), zero.reshape(view)
    info = np.iinfo(zero.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(x / scale) + zero.astype(np.float32)
    return np.clip(q, info.min, info.max).astype(zero.dtype)
