"""Clip whose min or max is a runtime tensor -> Max / Min: the HTP's Clip takes constant bounds only."""
from __future__ import annotations

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "clip"
OPS = ("Clip",)
WHAT = "Clip with a runtime min/max -> Max/Min"


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Clip" and len(n.input) > 1]:
        bounds = [(op, b) for op, b in zip(("Max", "Min"), node.input[1:3]) if b]
        if all(g.const(b) is not None for _, b in bounds):
            continue
        y = node.input[0]
        for op, b in bounds:
            y = g.node(op, [y, b], f"{node.name or 'clip'}_{op.lower()}").output[0]
        g.replace_uses(node.output[0], y)
        done += 1
    return done
