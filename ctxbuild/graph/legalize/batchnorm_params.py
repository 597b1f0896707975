"""BatchNormalization parameters given by DequantizeLinear of a constant -> the float constants: quantize_static
quantizes a BatchNormalization's scale like a weight (when it is a Constant node, as paddle2onnx writes it), and
QNN's BatchNorm then computes wrongly on the HTP (the first BatchNorm of a PP-OCR classifier: cosine 0.51 against
the QDQ model on the CPU EP; with float parameters, as QNN takes them, 1.0000 at the model's output). After
onnxruntime's quant_pre_process the bias is an int32 DequantizeLinear, which QNN refuses ("unsupported datatype").

Exact: the constant is what onnxruntime's DequantizeLinear computes, (q - zero point) * scale in float32, per
tensor or along `axis`, for 8-, 16- and 32-bit data."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "batchnorm_params"
OPS = ("BatchNormalization",)
WHAT = "BatchNormalization's scale/bias/mean/variance from DequantizeLinear of a constant -> float constants"


def wanted(g: GraphView) -> bool:
    return any(_dequantized(g, i) for n in g.graph.node if n.op_type == "BatchNormalization" for i in n.input[1:])


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "BatchNormalization"]:
        changed = False
        for k in range(1, len(node.input)):
            dq = _dequantized(g, node.input[k])
            if dq is None:
                continue
            value = _value(g, dq)
            if isinstance(value, str):
                g.keep(node, f"input '{node.input[k]}': {value}")
                continue
            node.input[k] = g.add_const(f"{node.input[k]}_float", value)
            changed = True
        done += changed
    return done


def _dequantized(g: GraphView, name: str) -> Any:
    """The DequantizeLinear producing `name` from a constant, else None."""
    node = g.producer.get(name)
    if node is None or node.op_type != "DequantizeLinear" or g.const(node.input[0]) is None:
        return None
    return node


def _value(g: GraphView, dq: Any) -> np.ndarray | str:
    """What onnxruntime's DequantizeLinear computes from the constant, or why it is left."""
    attrs = {a.name: a for a in dq.attribute}
    if set(attrs) - {"axis"}:
        return f"attributes {sorted(set(attrs) - {'axis'})} (only per-tensor and per-axis forms are folded)"
    q, scale = g.const(dq.input[0]), g.const(dq.input[1])
    zero = g.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if scale is None or (len(dq.input) > 2 and dq.input[2] and zero is None):
        return "its scale or zero point is computed at run time"
    if q.dtype.kind not in "iu" or q.dtype.itemsize > 4 or scale.dtype != np.float32 or scale.ndim > 1:
        return f"{q.dtype} data with a {scale.dtype}{list(scale.shape)} scale: not folded"
    zero = np.zeros(scale.shape, np.int32) if zero is None else zero.astype(np.int32)
    if scale.size > 1:
        axis = attrs["axis"].i if "axis" in attrs else 1
        if q.ndim == 0 or not -q.ndim <= axis < q.ndim or q.shape[axis] != scale.size:
            return f"per-axis scale of {scale.size} does not match axis {axis} of {list(q.shape)}"
        view = [1] * q.ndim
        view[axis] = scale.size
        scale, zero = scale.reshape(view), zero.reshape(view)
    return ((q.astype(np.int32) - zero).astype(np.float32) * scale).astype(np.float32)
