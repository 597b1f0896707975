"""Multiply-accumulates per node, from the graph and onnx's shape inference (the weights need not be loaded).

Only the ops whose cost is multiplications dominate a model's compute: matrix products, convolutions and
recurrent cells. Elementwise ops, reductions and data movement count as 0: a share of MACs says how much of
the arithmetic a partition holds, not how long it runs (a CPU node also costs a round trip to the NPU)."""
from __future__ import annotations

import math
from typing import Any

from ctxbuild.graph.nodenames import key

MATMULS = ("MatMul", "MatMulInteger", "Gemm", "FusedMatMul")
CONVS = ("Conv", "ConvInteger", "ConvTranspose")
# onnxruntime contrib ops onnx's shape inference does not know, whose (first) output has their input's shape
SAME_SHAPE = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization",
              "Gelu", "FastGelu", "BiasGelu", "QuickGelu")
RECURRENT = {"GRU": 3, "LSTM": 4, "RNN": 1}  # gates per step


def node_macs(model: Any) -> dict[str, int]:
    """node (nodenames.key: an unnamed one by its first output) -> its multiply-accumulates for one run (0 where
    unknown or not a product)."""
    shapes = _shapes(model)
    out = {}
    for n in model.graph.node:
        ins = [shapes.get(i) if i else None for i in n.input]
        outs = [shapes.get(o) for o in n.output]
        out[key(n)] = _macs(n, ins, outs)
    return out


def share(macs: dict[str, int], nodes: set[str]) -> tuple[int, int]:
    """(MACs of `nodes`, MACs of the whole model)."""
    return sum(v for k, v in macs.items() if k in nodes), sum(macs.values())


def _macs(n: Any, ins: list[list[int] | None], outs: list[list[int] | None]) -> int:
    out = outs[0] if outs else None
    if n.op_type in MATMULS and out is not None and ins and ins[0]:
        a = ins[0]
        trans_a = next((x.i for x in n.attribute if x.name == "transA"), 0)
        k = a[-2] if (n.op_type == "Gemm" and trans_a) else a[-1]
        return math.prod(out) * k
    if n.op_type in ("Conv", "ConvInteger") and out is not None and len(ins) > 1 and ins[1]:
        return math.prod(out) * math.prod(ins[1][1:])  # per output: C_in/group x kernel
    if n.op_type == "ConvTranspose" and len(ins) > 1 and ins[0] and ins[1]:
        return math.prod(ins[0]) * math.prod(ins[1][1:])  # per input: C_out/group x kernel
    if n.op_type == "Einsum" and len(ins) == 2 and all(ins):
        return _einsum(next(x.s.decode() for x in n.attribute if x.name == "equation"), ins)
    if n.op_type in RECURRENT and ins and ins[0] and len(ins) > 2 and ins[1] and ins[2]:
        x, w, r = ins[0], ins[1], ins[2]  # W: [dirs, gates*H, I], R: [dirs, gates*H, H]
        return x[0] * x[1] * (math.prod(w) + math.prod(r))
    return 0


def _einsum(equation: str, ins: list[list[int] | None]) -> int:
    """A two-operand Einsum multiplies once per combination of all its indices (kept and summed)."""
    terms = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, ins):
        if "." in term or len(term) != len(shape or []):
            return 0  # ellipsis: not counted
        sizes.update(zip(term, shape or []))
    return math.prod(sizes.values())


def _shapes(model: Any) -> dict[str, list[int]]:
    """Static shapes from onnx's inference. It stops at onnxruntime's contrib ops (the rmsnorm rule's
    SimplifiedLayerNormalization): in a copy, those that keep their input's shape become Identity."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for i, n in enumerate(m.graph.node):
        if n.op_type in SAME_SHAPE:
            m.graph.node[i].CopyFrom(helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name))
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - a cost estimate: unknown shapes count as 0
        pass
    return _known(m.graph)


def _known(g: Any) -> dict[str, list[int]]:
    shapes = {i.name: list(i.dims) for i in g.initializer}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = [d.dim_value for d in t.shape.dim]
    return shapes
