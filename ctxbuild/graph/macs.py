"""Multiply-accumulates per node, from the graph and onnx's shape inference (the weights need not be loaded).

Only the ops whose cost is multiplications dominate a model's compute: matrix products, convolutions, recurrent
cells and attention. Elementwise ops, reductions and data movement count as 0: a share of MACs says how much of the
arithmetic a partition holds, not how long it runs (a CPU node also costs a round trip to the NPU). A node of an op
with MACs whose shapes are not known, or of a domain this table does not know (a custom op), is None: "unknown", to
be said as such, never counted as 0."""
from __future__ import annotations

import math
from typing import Any

from ctxbuild.graph.nodenames import key

MATMULS = ("MatMul", "MatMulInteger", "Gemm", "FusedMatMul", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QGemm",
           "MatMulNBits")
CONVS = ("Conv", "ConvInteger", "FusedConv", "NhwcConv", "DeformConv")  # the weight is input 1
QLINEAR = {"QLinearMatMul": 3, "QLinearConv": 3, "QLinearConvTranspose": 3}  # op -> the weight's input index
RECURRENT = {"GRU": 3, "LSTM": 4, "RNN": 1}  # gates per step
ATTENTION = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "QAttention", "PackedAttention",
             "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention", "SparseAttention",
             "DecoderMaskedSelfAttention", "LongformerAttention")
WITH_MACS = frozenset((*MATMULS, *CONVS, *QLINEAR, *RECURRENT, *ATTENTION, "ConvTranspose", "Einsum"))
# Domains whose every other op is elementwise, a reduction, a normalization or data movement.
KNOWN_DOMAINS = ("", "ai.onnx", "com.microsoft", "com.ms.internal.nhwc")
# onnxruntime contrib ops onnx's shape inference does not know, whose (first) output has their input's shape
SAME_SHAPE = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization",
              "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "QuantizeLinear", "DequantizeLinear")


def node_macs(model: Any) -> dict[str, int | None]:
    """node (nodenames.key: an unnamed one by its first output) -> its multiply-accumulates for one run; 0 for an op
    without (elementwise, data movement), None where it has some that cannot be counted (shapes not known)."""
    shapes = _shapes(model)
    out: dict[str, int | None] = {}
    for n in model.graph.node:
        if n.domain not in KNOWN_DOMAINS:
            out[key(n)] = None
            continue
        if n.op_type not in WITH_MACS:
            out[key(n)] = 0
            continue
        ins = [shapes.get(i) if i else None for i in n.input]
        outs = [shapes.get(o) for o in n.output]
        try:
            out[key(n)] = _macs(n, ins, outs)
        except (IndexError, ValueError, ZeroDivisionError, StopIteration):  # a form of the op this does not read
            out[key(n)] = None
    return out


def share(macs: dict[str, int | None], nodes: set[str]) -> tuple[int, int]:
    """(MACs of `nodes`, MACs of the whole model), counted ones only (`uncounted` names the others)."""
    return sum(v or 0 for k, v in macs.items() if k in nodes), sum(v or 0 for v in macs.values())


def uncounted(macs: dict[str, int | None]) -> list[str]:
    """The nodes whose MACs are not known."""
    return [k for k, v in macs.items() if v is None]


def _attr(n: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in n.attribute if a.name == name), default)


def _macs(n: Any, ins: list[list[int] | None], outs: list[list[int] | None]) -> int | None:
    out = outs[0] if outs else None
    op = n.op_type
    if op in MATMULS:
        if out is None or not ins or not ins[0]:
            return None
        a = ins[0]
        k = a[-2] if (op in ("Gemm", "QGemm") and _attr(n, "transA", 0)) else a[-1]
        return math.prod(out) * k
    if op == "QLinearMatMul":
        return math.prod(out) * ins[0][-1] if out is not None and ins[0] else None
    if op in CONVS or op == "QLinearConv":
        w = ins[QLINEAR.get(op, 1)] if len(ins) > QLINEAR.get(op, 1) else None
        return math.prod(out) * math.prod(w[1:]) if out is not None and w else None  # per output: C_in/group x kernel
    if op in ("ConvTranspose", "QLinearConvTranspose"):
        x, w = ins[0], ins[QLINEAR.get(op, 1)] if len(ins) > QLINEAR.get(op, 1) else None
        return math.prod(x) * math.prod(w[1:]) if x and w else None  # per input: C_out/group x kernel
    if op == "Einsum":
        if len(ins) != 2 or not all(ins):
            return None
        return _einsum(_attr(n, "equation").decode(), ins)
    if op in RECURRENT:
        if len(ins) < 3 or not (ins[0] and ins[1] and ins[2]):
            return None
        x, w, r = ins[0], ins[1], ins[2]  # W: [dirs, gates*H, I], R: [dirs, gates*H, H]; X [T, B, I] or [B, T, I]
        return x[0] * x[1] * (math.prod(w) + math.prod(r))
    return _attention(n, ins)


def _attention(n: Any, ins: list[list[int] | None]) -> int | None:
    """Q.K^T and the weights times V per head, plus the fused QKV projection where the op has one: for the forms
    whose shapes say the sizes (query [B, S, D] with key and value, or onnx's 4D [B, heads, S, head size]); None for
    the packed and sparse forms."""
    op = n.op_type
    q = ins[0] if ins else None
    if q is None:
        return None
    if op == "Attention" and n.domain in ("", "ai.onnx"):  # onnx 23: Q, K, V 4D [B, heads, S, size] or 3D [B, S, hidden]
        k, v = (ins[1] if len(ins) > 1 else None), (ins[2] if len(ins) > 2 else None)
        past = ins[4] if len(ins) > 4 and ins[4] else None
        if not k or not v or len(q) != len(k) or len(q) not in (3, 4):
            return None
        if len(q) == 4:  # per query head, query position and key position: the head size, for Q.K^T and for V
            return q[0] * q[1] * q[2] * (k[2] + (past[2] if past else 0)) * (q[3] + v[3])
        heads, kv_heads = _attr(n, "q_num_heads"), _attr(n, "kv_num_heads")
        total = k[1] + (past[2] if past else 0)
        return q[0] * q[1] * total * (q[2] + v[2] * heads // kv_heads) if heads and kv_heads else None
    if op in ("Attention", "QAttention"):  # contrib: input [B, S, in], weights [in, 3 x hidden]; past [2, B, N, P, H]
        w = ins[1] if len(ins) > 1 else None
        if not w or len(q) != 3:
            return None
        b, s, hidden = q[0], q[1], w[1] // 3
        past = ins[4] if len(ins) > 4 and ins[4] else None
        total = s + (past[3] if past else 0)
        return b * s * q[2] * w[1] + 2 * b * s * total * hidden
    if op in ("MultiHeadAttention", "GroupQueryAttention"):  # query [B, S, D], key [B, L, Dk], value [B, L, Dv]
        k, v = (ins[1] if len(ins) > 1 else None), (ins[2] if len(ins) > 2 else None)
        if len(q) != 3 or not k or not v or len(k) != 3:
            return None
        past_at = 6 if op == "MultiHeadAttention" else 3
        past = ins[past_at] if len(ins) > past_at and ins[past_at] else None
        heads, kv_heads = _attr(n, "num_heads"), _attr(n, "kv_num_heads") or _attr(n, "num_heads")
        total = k[1] + (past[2] if past and op == "MultiHeadAttention" else 0)
        if op == "GroupQueryAttention" and past:  # the present KV is the past buffer with this step written in
            total = max(past[2], k[1])
        # per query position and key position: head size x query heads for Q.K^T and for the weights times V
        return q[0] * q[1] * total * (q[2] + v[2] * heads // kv_heads)
    return None


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
    SimplifiedLayerNormalization, the 16-bit QuantizeLinear/DequantizeLinear of a w8a16 QDQ model, before every
    weight and activation): in a copy, those that keep their input's shape become Identity."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for i, n in enumerate(m.graph.node):
        if n.op_type == "DequantizeLinear" and n.domain not in ("", "ai.onnx"):  # 16-bit Q/DQ are com.microsoft's
            m.graph.node[i].CopyFrom(helper.make_node("Cast", [n.input[0]], [n.output[0]], to=TensorProto.FLOAT))
        elif n.op_type in SAME_SHAPE and n.domain not in ("", "ai.onnx"):
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
