"""ReduceSumSquare(x) -> ReduceSum(Mul(x, x)): QNN has no ReduceSumSquare (the EP refuses the node), and it is
how exporters write a power spectrum (onnx-asr's log-mel front ends: |STFT|^2 summed over real and imaginary
parts). The same sum in the same order: exact."""
from __future__ import annotations

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "sum_squares"
OPS = ("ReduceSumSquare",)
WHAT = "ReduceSumSquare -> ReduceSum(Mul(x, x)) (QNN has no ReduceSumSquare)"


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "ReduceSumSquare"]:
        axes = g.reduce_axes(node)
        if axes is False:
            g.keep(node, "its axes are a runtime tensor, or it reduces nothing (noop_with_empty_axes)")
            continue
        base = node.name or "sum_squares"
        square = g.node("Mul", [node.input[0], node.input[0]], f"{base}_square").output[0]
        g.replace_uses(node.output[0], g.reduce_sum(square, axes, g.attr(node, "keepdims", 1), base))
        done += 1
    if done:
        g.reindex()
    return done
