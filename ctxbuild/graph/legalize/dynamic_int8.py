"""onnxruntime `quantize_dynamic` output -> the float model it was made from (weights dequantized).

The HTP runs neither DynamicQuantizeLinear nor MatMulInteger (integer MatMul with a per-run activation
scale). As `quantize_dynamic` writes it, DynamicQuantizeLinear(x) -> MatMulInteger(xq, Wq, xzp, wzp) -> Cast(float)
-> Mul(x_scale * w_scale) becomes MatMul(x, (Wq - wzp) * w_scale); an int8 table read by data moves into
MatMulInteger (its scale a constant) becomes the float table's. The recipe's precision then quantizes the float
model statically, like any other export. An int8 table into a DequantizeLinear is int8_tables' (exact, checked
on its own)."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView
from ctxbuild.graph.legalize.int8_tables import float_table

NAME = "dynamic_int8"
OPS = ("MatMulInteger", "DynamicQuantizeLinear")
WHAT = "DynamicQuantizeLinear + MatMulInteger (and int8 tables into it) -> float MatMul"
# The sample check's bound (check.py): the rewrite drops the export's per-run activation quantization, so it moves
# the outputs by that quantization's error by design (measured on a small MLP: 0.4% of the largest output per
# tensor, 9% per channel; a T5 encoder export: 92%, cosine 0.55). 25% still catches a misread scale or weight
# (they move outputs by their whole size; exactness is the unit tests'); how close the result must come to the
# user's model is verification's call, with the recipe's thresholds.
TOLERANCE = 0.25


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
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
                    not float_table(g, mm.input[0], 1.0, float(azp.item())):
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
