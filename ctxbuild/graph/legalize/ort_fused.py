"""onnxruntime's fused transformer ops in an export -> the standard ops they fuse: FastGelu -> its tanh formula,
SkipLayerNormalization -> Add + LayerNormalization.

Exports saved after onnxruntime's transformer optimizer (Kokoro-82M's int8 export: its ALBERT's 12 layers) carry
com.microsoft FastGelu and SkipLayerNormalization, which QNN refuses. Written out in standard ops they compute
the same values (FastGelu is defined by the formula written here; SkipLayerNormalization is the LayerNormalization
of input + skip [+ bias] over the last axis) and QNN runs them."""
from __future__ import annotations

import math

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "ort_fused"
OPS = ("FastGelu", "SkipLayerNormalization")
WHAT = "onnxruntime's FastGelu, SkipLayerNormalization -> tanh GELU, Add + LayerNormalization"
LAYERNORM_OPSET = 17  # LayerNormalization is standard from opset 17


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.domain == "com.microsoft" and n.op_type in OPS]:
        base = node.name or node.output[0]
        if node.op_type == "FastGelu":
            x = node.input[0]
            if len(node.input) > 1 and node.input[1]:
                x = g.node("Add", [x, node.input[1]], f"{base}_bias").output[0]
            g.replace_uses(node.output[0], _tanh_gelu(g, x, base))
            done += 1
            continue
        if g.opset < LAYERNORM_OPSET:
            g.keep(node, f"the model's opset {g.opset} has no LayerNormalization (opset {LAYERNORM_OPSET})")
            continue
        if any(o for o in node.output[1:3] if g.consumers.get(o) or o in g.outputs):
            g.keep(node, "its mean or inverse standard deviation output is read")
            continue
        s = g.node("Add", node.input[:2], f"{base}_skip").output[0]
        if len(node.input) > 4 and node.input[4]:
            s = g.node("Add", [s, node.input[4]], f"{base}_bias").output[0]
        norm_inputs = [s, node.input[2]] + ([node.input[3]] if len(node.input) > 3 and node.input[3] else [])
        eps = g.attr(node, "epsilon", 1e-12)
        y = g.node("LayerNormalization", norm_inputs, f"{base}_norm", axis=-1, epsilon=eps).output[0]
        g.replace_uses(node.output[0], y)
        if len(node.output) > 3 and node.output[3]:
            g.replace_uses(node.output[3], s)  # input_skip_bias_sum
        done += 1
    if done:
        g.reindex()
    return done


def _tanh_gelu(g: GraphView, x: str, base: str) -> str:
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))): FastGelu's definition."""
    def const(name: str, v: float) -> str:
        return g.add_const(f"{base}_{name}", np.array(v, np.float32))

    cube = g.node("Mul", [g.node("Mul", [x, x], f"{base}_sq").output[0], x], f"{base}_cube").output[0]
    inner = g.node("Add", [x, g.node("Mul", [cube, const("c", 0.044715)], f"{base}_c3").output[0]],
                   f"{base}_inner").output[0]
    t = g.node("Tanh", [g.node("Mul", [inner, const("k", math.sqrt(2 / math.pi))], f"{base}_scaled").output[0]],
               f"{base}_tanh").output[0]
    half = g.node("Mul", [x, const("half", 0.5)], f"{base}_half").output[0]
    return g.node("Mul", [half, g.node("Add", [t, const("one", 1.0)], f"{base}_one").output[0]],
                  f"{base}_gelu").output[0]
