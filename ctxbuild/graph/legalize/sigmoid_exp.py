"""fp16 only: Sigmoid -> 1 / (1 + Exp(-x)); SiLU, x * Sigmoid(x), -> x / (1 + Exp(-x)).

Not an op the HTP refuses, one it computes coarsely at fp16: its Sigmoid has an absolute error floor, which
small outputs (a detector's scores) and a Conv before it (QNN fuses the two) show. Measured on the SM8650
simulator: a Sigmoid alone on logits N(-7, 2.5) (outputs near 1e-3) 47.6 dB, written out 64.6 dB; one Conv 64 ->
64, 3x3, on [1, 64, 40, 40], N(-1, 4) inputs: the Conv alone 68.9 dB, Conv -> Sigmoid 49.5 dB, Conv -> SiLU
51.7 dB, written out 66.8 and 66.0 dB. YOLO detectors follow every Conv with SiLU and end in a Sigmoid over the
class logits: NudeNet's YOLOv8n at fp16 verified its score slice at 18.6 dB (max error 0.031 on scores up to
0.23), 36.6 dB rewritten (0.0028).

Applied by compile to fp16 builds alone (legalize.FP16_RULES), not by prepare: quantized, Exp(-x) spans 1e-9
to 1e9, which no 16-bit scale holds. Not in bundles (one shared-weight compile of the prepared models). The same function: in fp16 Exp(-x) overflows to inf below x = -11.1, where
1 / (1 + inf) = 0 and x / inf = 0 (sigmoid there is under 1.6e-5). The rewritten nodes keep the user's names:
the Reciprocal is named and outputs as the Sigmoid, the Div as the SiLU's Mul."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "sigmoid_exp"
OPS = ("Sigmoid",)
WHAT = "fp16: Sigmoid -> 1 / (1 + Exp(-x)), SiLU -> x / (1 + Exp(-x)) (the HTP's fp16 Sigmoid is coarse)"


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for sig in [n for n in g.graph.node if n.op_type == "Sigmoid"]:
        x = sig.input[0]
        one = g.add_const(f"{sig.name or x}_one", np.array(1.0, _float_type(g, x)))
        neg = g.node("Neg", [x], f"{sig.name or x}_neg").output[0]
        exp = g.node("Exp", [neg], f"{sig.name or x}_exp").output[0]
        denominator = g.node("Add", [exp, one], f"{sig.name or x}_denominator").output[0]
        users = g.consumers.get(sig.output[0], [])
        silu = users[0] if len(users) == 1 and sig.output[0] not in g.outputs and _is_silu(users[0], x, sig) else None
        last, op, inputs = (silu, "Div", [x, denominator]) if silu else (sig, "Reciprocal", [denominator])
        _take_place(g, last, op, inputs)
        if silu:
            g.graph.node.remove(sig)
        done += 1
    if done:
        g.prune()
    return done


def _float_type(g: GraphView, x: str) -> type:
    """x's float type: a Conv's weight's, a typed tensor's, else float32 (the exports' type); no weight is read."""
    from onnx import helper

    producer = g.producer.get(x)
    if producer is not None and producer.op_type in ("Conv", "Gemm", "MatMul") and \
            (t := g.const_type(producer.input[1])) is not None:
        return helper.tensor_dtype_to_np_dtype(t)
    for vi in list(g.graph.input) + list(g.graph.value_info):
        if vi.name == x:
            return helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    return np.float32


def _is_silu(mul: Any, x: str, sig: Any) -> bool:
    return mul.op_type == "Mul" and sorted(mul.input) == sorted([x, sig.output[0]])


def _take_place(g: GraphView, old: Any, op: str, inputs: list[str]) -> None:
    """`old` replaced by `op(inputs)` under its own name and output tensor (the user's names stay)."""
    name, output = old.name, old.output[0]
    g.graph.node.remove(old)
    g.node(op, inputs, f"{name or output}_rewritten", outputs=[output])
    g.graph.node[-1].name = name  # the appended copy (node() returns the proto before the graph copied it)
