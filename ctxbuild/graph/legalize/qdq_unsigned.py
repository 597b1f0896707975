"""Signed activations in a QDQ model (int8/int16 QuantizeLinear -> DequantizeLinear pairs) -> unsigned ones
(uint8/uint16): the HTP runs most ops on unsigned activations only, and onnxruntime's quantize_static writes
signed ones by default (activation_type QInt8); QNN refused the HardSigmoid and BatchNorm of such a PP-OCR model.

Exact: a signed tensor q with zero point z and scale s holds the same values as the unsigned q + 2^(b-1) with
zero point z + 2^(b-1) and the same scale (clamping moves with it: [-128, 127] + 128 = [0, 255]). Only where a
QuantizeLinear of a runtime tensor feeds nothing but DequantizeLinear nodes with the same scale and zero point
(values) and the same axis, and is no graph output: then the integer tensor is seen by no other op. Weights
(constants) stay signed: QNN takes signed symmetric weights."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "qdq_unsigned"
OPS = ("QuantizeLinear",)
WHAT = "signed int8/int16 activation QuantizeLinear/DequantizeLinear pairs -> uint8/uint16 (zero point + 128/32768)"
UNSIGNED = {np.dtype(np.int8): np.uint8, np.dtype(np.int16): np.uint16}


def wanted(g: GraphView) -> bool:
    return any(n.op_type == "QuantizeLinear" and len(n.input) > 2 and _signed(g, n.input[2]) for n in g.graph.node)


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2]:
        zero = _signed(g, node.input[2])
        if zero is None or g.const(node.input[0]) is not None:
            continue
        why = _why_not(g, node, zero)
        if why:
            g.keep(node, why)
            continue
        half = np.iinfo(zero.dtype).max + 1
        shifted = g.add_const(f"{node.input[2]}_unsigned", (zero.astype(np.int32) + half).astype(UNSIGNED[zero.dtype]))
        for n in [node, *g.consumers[node.output[0]]]:
            n.input[2] = shifted
        done += 1
    return done


def _signed(g: GraphView, name: str) -> np.ndarray | None:
    value = g.const(name) if name else None
    return value if value is not None and value.dtype in UNSIGNED else None


def _why_not(g: GraphView, node: Any, zero: np.ndarray) -> str | None:
    """Why the pair may not be shifted (its integer tensor reaches something but a matching DequantizeLinear)."""
    out = node.output[0]
    readers = g.consumers.get(out, [])
    if out in g.outputs:
        return "its integer output is a graph output"
    if {a.name for a in node.attribute} - {"axis"}:
        return f"attributes {sorted({a.name for a in node.attribute} - {'axis'})} (opset 21 forms are left)"
    scale = g.const(node.input[1])
    axis = _axis(node)
    for r in readers:
        if r.op_type != "DequantizeLinear":
            return f"its integer output is read by '{r.name}' ({r.op_type})"
        if len(r.input) < 3 or not _same(g.const(r.input[2]), zero) or not _same(g.const(r.input[1]), scale):
            return f"'{r.name}' dequantizes with another scale or zero point"
        if _axis(r) != axis or {a.name for a in r.attribute} - {"axis"}:
            return f"'{r.name}' has other attributes"
    return None


def _axis(node: Any) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is not None and b is not None and a.dtype == b.dtype and np.array_equal(a, b)
