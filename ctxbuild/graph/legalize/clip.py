"""Clip whose min or max is a runtime tensor -> Less/Greater + Where: the HTP's Clip takes constant bounds only.

Where(x < min, min, x) is what onnxruntime's Clip computes, NaN included: a NaN bound leaves x as it is (Max(x,
NaN) would make every output NaN) and a NaN x stays NaN. Only bounds onnxruntime takes as scalars ([] or [1]; it
refuses [1, 1]) whose rank is at most x's: Clip's output has x's shape, and a [1]-shaped bound broadcast against
a scalar x would give it a dimension."""
from __future__ import annotations

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "clip"
OPS = ("Clip",)
WHAT = "Clip with a runtime min/max -> Less/Greater + Where"


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Clip" and len(n.input) > 1]:
        bounds = [(op, b) for op, b in zip(("Less", "Greater"), node.input[1:3]) if b]
        if all(g.const(b) is not None for _, b in bounds):
            continue
        odd = [b for _, b in bounds if not _fits(g, b, shapes.get(node.input[0]), shapes)]
        if odd:
            g.keep(node, f"bound '{odd[0]}' is not known to be a scalar ([] or [1]) of rank at most the input's")
            continue
        y = node.input[0]
        for op, b in bounds:  # Clip is max then min: y < min -> min; then y > max -> max
            base = f"{node.name or 'clip'}_{op.lower()}"
            out_of_range = g.node(op, [y, b], base).output[0]
            y = g.node("Where", [out_of_range, b, y], f"{base}_where").output[0]
        g.replace_uses(node.output[0], y)
        done += 1
    return done


def _fits(g: GraphView, bound: str, x: list[int] | None, shapes: dict[str, list[int]]) -> bool:
    """`bound` is a scalar to Clip ([] or [1]) of rank at most x's (known statically): broadcast, it leaves x's
    shape."""
    value = g.const(bound)
    shape = list(value.shape) if value is not None else shapes.get(bound)
    return x is not None and shape in ([], [1]) and len(shape) <= len(x)
