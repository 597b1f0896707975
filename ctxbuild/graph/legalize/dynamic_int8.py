"""onnxruntime `quantize_dynamic` output -> the float model it was made from (weights dequantized).

The HTP runs neither DynamicQuantizeLinear nor MatMulInteger (integer MatMul with a per-run activation
scale). Two patterns, as `quantize_dynamic` writes them:
- DynamicQuantizeLinear(x) -> MatMulInteger(xq, Wq, xzp, wzp) -> Cast(float) -> Mul(x_scale * w_scale)
  becomes MatMul(x, (Wq - wzp) * w_scale);
- an int8 table read by data movement only (Gather, Transpose, Reshape, ...) into a per-tensor
  DequantizeLinear becomes the dequantized float table read the same way.
The recipe's precision then quantizes the float model statically, like any other export."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "dynamic_int8"
OPS = ("MatMulInteger", "DynamicQuantizeLinear", "DequantizeLinear")
WHAT = "DynamicQuantizeLinear + MatMulInteger, int8 tables + DequantizeLinear -> float MatMul / float tables"
MOVES = ("Gather", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice")  # value-preserving
# The sample check's bound (check.py): the rewrite drops the export's per-run activation quantization, so it moves
# the outputs by that quantization's error by design (measured on a small MLP: 0.4% of the largest output per
# tensor, 9% per channel; a T5 encoder export: 92%, cosine 0.55). 25% still catches a misread scale or weight
# (they move outputs by their whole size; exactness is the unit tests'); how close the result must come to the
# user's model is verification's call, with the recipe's thresholds.
TOLERANCE = 0.25


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    return _matmuls(g) + _tables(g)


def _matmuls(g: GraphView) -> int:
    done = 0
    for mm in [n for n in g.graph.node if n.op_type == "MatMulInteger"]:
        chain = _scale_chain(g, mm)
        wq = g.const(mm.input[1])
        wzp = _zero_point(g, mm, 3, wq)
        if chain is None or wq is None or wzp is None:
            continue
        mul, scale = chain
        dq = g.producer.get(mm.input[0])
        if dq is not None and dq.op_type == "DynamicQuantizeLinear":
            if len(mm.input) > 2 and mm.input[2] and mm.input[2] != dq.output[2]:
                continue  # an activation zero point other than the dynamic one: not quantize_dynamic's pattern
            w_scale = _other_factor(g, scale, dq.output[1])
            x = dq.input[0]  # the activation as it was before the per-run quantization
        else:  # an int8 table read by data moves (quantize_dynamic's Gather): its scale is a constant too
            azp = _zero_point(g, mm, 2, None)
            w_scale = g.const(scale) if g.const(scale) is not None else _other_factor(g, scale, None)
            if azp is None or azp.size != 1 or g.consumers.get(mm.input[0]) != [mm] or \
                    not _float_table(g, mm.input[0], 1.0, float(azp.item())):
                continue
            x = mm.input[0]  # now the table's (q - zero point) in float, moved as before
        if w_scale is None:
            continue
        scale_c, zp_c = _per_column(w_scale, wq), _per_column(wzp, wq)
        if scale_c is None or zp_c is None:
            g.keep(mm, f"weight scale {list(w_scale.shape)} / zero point {list(wzp.shape)} are neither per tensor "
                       f"nor per column of the {list(wq.shape)} weight")
            continue
        w = (wq.astype(np.float32) - zp_c.astype(np.float32)) * scale_c.astype(np.float32)
        y = g.node("MatMul", [x, g.add_const(f"{mm.input[1]}_float", w)], f"{mm.name or 'matmul'}_float")
        g.replace_uses(mul.output[0], y.output[0])
        done += 1
    return done


def _per_column(v: np.ndarray, wq: np.ndarray) -> np.ndarray | None:
    """`v` (a weight scale or zero point) as a scalar or one value per column of the weight `wq` [K, N]
    (quantize_dynamic's per-channel MatMul), else None."""
    if v.size == 1:
        return v.reshape(())
    n = wq.shape[-1] if wq.ndim else 0
    return v.reshape(n) if v.size == n and v.shape[-1] == n else None


def _zero_point(g: GraphView, node: Any, k: int, like: np.ndarray | None) -> np.ndarray | None:
    if len(node.input) > k and node.input[k]:
        return g.const(node.input[k])
    return np.zeros((), like.dtype if like is not None else np.int8)


def _scale_chain(g: GraphView, mm: Any) -> tuple[Any, str] | None:
    """MatMulInteger -> Cast -> Mul(scale): the final Mul and the scale tensor's name, or None."""
    uses = g.consumers.get(mm.output[0], [])
    if len(uses) != 1 or uses[0].op_type != "Cast":
        return None
    muls = g.consumers.get(uses[0].output[0], [])
    if len(muls) != 1 or muls[0].op_type != "Mul":
        return None
    return muls[0], next(i for i in muls[0].input if i != uses[0].output[0])


def _other_factor(g: GraphView, product: str, known: str | None) -> np.ndarray | None:
    """For `product` = Mul(a, b): the constant value of the factor that is not `known` (None: both are
    constants, their product)."""
    node = g.producer.get(product)
    if node is None or node.op_type != "Mul" or (known is not None and known not in node.input):
        return None
    values = [g.const(i) for i in node.input if i != known]
    if not values or any(v is None for v in values):
        return None
    return functools.reduce(np.multiply, values)  # a per-tensor and a per-column factor broadcast


def _tables(g: GraphView) -> int:
    done = 0
    quantized = {n.input[0] for n in g.graph.node if n.op_type == "DequantizeLinear"}
    for name in sorted(quantized):
        # onnxruntime's optimizer gives each consumer its own copy of a DequantizeLinear: all must agree
        dqls = g.consumers.get(name, [])
        params = {_per_tensor(g, d) for d in dqls}
        if any(d.op_type != "DequantizeLinear" for d in dqls) or len(params) != 1 or None in params:
            continue
        if g.const(name) is not None:
            continue  # a weight DequantizeLinear (static QDQ): kept, the QDQ path reads it
        ((scale, zp),) = params
        if _float_table(g, name, scale, zp):
            for d in dqls:
                g.replace_uses(d.output[0], name)
            done += 1
    return done


def _float_table(g: GraphView, name: str, scale: float, zp: float) -> bool:
    """Make `name`, data moves of a constant int8 table, the same moves of (table - zp) * scale in float."""
    path = _moves_to_constant(g, name)
    if path is None:
        return False
    first, table = path
    value = (g.const(table).astype(np.float32) - np.float32(zp)) * np.float32(scale)
    first.input[0] = g.add_const(f"{table}_float", value)  # the moves after it follow in float
    return True


def _per_tensor(g: GraphView, dql: Any) -> tuple[float, float] | None:
    """(scale, zero point) of a per-tensor DequantizeLinear with constant parameters, else None."""
    scale = g.const(dql.input[1])
    zp = g.const(dql.input[2]) if len(dql.input) > 2 and dql.input[2] else np.zeros(())
    if scale is None or zp is None or scale.size != 1 or zp.size != 1:
        return None  # per-axis: the axis moves with Transpose/Gather; not a pattern seen
    return float(scale.item()), float(zp.item())


def _moves_to_constant(g: GraphView, name: str) -> tuple[Any, str] | None:
    """Walk back from a DequantizeLinear's input through data moves (each read only by the next) to a
    constant table: (the first move, the table's name), or None."""
    node = g.producer.get(name)
    while node is not None and node.op_type in MOVES:
        if g.const(node.input[0]) is not None:
            return node, node.input[0]
        node = g.producer.get(node.input[0])
        if node is not None and len(g.consumers.get(node.output[0], [])) != 1:
            return None
    return None
