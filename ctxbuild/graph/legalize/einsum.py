"""Einsum -> Transpose + MatMul (+ Transpose): the HTP has no Einsum.

Handles two-operand equations that are a batched matrix product: one contracted index, one free index on one
side, any number on the other, shared batch indices (e.g. DeepFilterNet's grouped linear `btgi,gih->btgh`).
The side with several free indices keeps them as MatMul batch dims; the other side gets size-1 axes there,
so no static shape is needed. Other equations are left alone (the compile then names the node)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "einsum"
OPS = ("Einsum",)
WHAT = "Einsum (batched matrix product) -> Transpose + MatMul"


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Einsum"]:
        eq = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
        plan = _plan(eq.replace(" ", ""))
        if plan is None or len(node.input) != 2:
            continue
        a, b = node.input
        if plan.pop("swap"):
            a, b = b, a
        out = _rewrite(g, node, a, b, **plan)
        g.replace_uses(node.output[0], out)
        done += 1
    return done


def _plan(eq: str) -> dict[str, Any] | None:
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        return None
    for swap, (ta, tb) in ((False, terms), (True, terms[::-1])):
        batch = [c for c in out if c in ta and c in tb]
        contract = [c for c in ta if c in tb and c not in out]
        a_free = [c for c in ta if c not in tb and c in out]
        b_free = [c for c in tb if c not in ta and c in out]
        summed = [c for c in ta + tb if c not in out and not (c in ta and c in tb)]
        if summed or len(contract) != 1 or len(b_free) != 1 or not a_free:
            continue
        a_order = batch + a_free + contract
        b_order = batch + contract + b_free
        res = batch + a_free + b_free
        return {"swap": swap, "perm_a": [ta.index(c) for c in a_order], "perm_b": [tb.index(c) for c in b_order],
                "ones": list(range(len(batch), len(batch) + len(a_free) - 1)), "perm_out": [res.index(c) for c in out]}
    return None


def _rewrite(g: GraphView, node: Any, a: str, b: str, perm_a: list[int], perm_b: list[int], ones: list[int],
             perm_out: list[int]) -> str:
    base = node.name or "einsum"
    if perm_a != sorted(perm_a):
        a = g.node("Transpose", [a], f"{base}_a", perm=perm_a).output[0]
    bv = g.const(b)
    if bv is not None:  # a weight: transpose and reshape it once, here
        bv = np.transpose(bv, perm_b)
        b = g.add_const(f"{b}_matmul", np.expand_dims(bv, tuple(ones)) if ones else bv)
    else:
        if perm_b != sorted(perm_b):
            b = g.node("Transpose", [b], f"{base}_b", perm=perm_b).output[0]
        if ones:
            b = g.unsqueeze(b, ones, f"{base}_b_unsqueeze")
    y = g.node("MatMul", [a, b], f"{base}_matmul").output[0]
    if perm_out != sorted(perm_out):
        y = g.node("Transpose", [y], f"{base}_out", perm=perm_out).output[0]
    return y
