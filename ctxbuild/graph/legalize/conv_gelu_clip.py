"""fp16 only: Gelu(Conv(x)) -> Gelu(Clip(Conv(x), -65504, 65504)), which keeps QNN from fusing the two.

The HTP computes a fused Conv -> Gelu coarsely at fp16, as it does Conv -> Sigmoid (sigmoid_exp). Measured on the
SM8650 simulator with PP-OCRv6's small recognizer (13 Gelus, each after a Conv), on the float model's real inputs of
two of them (2 verification samples): Conv.8 -> Gelu_0 fused 41.7 dB, with this Clip 57.7 dB (the same as with the
Conv's output made a graph output; the Conv alone 67.3 dB); Conv.11 -> Gelu_1 40.8 -> 57.4 dB. An Identity, a Mul
by 1, an Add of 0 or a Transpose pair between them is optimized away (41.7 dB). Gelu has no form the HTP runs
without it (QNN has no Erf), so the two are kept apart instead.

The same function in fp16: the bounds are fp16's largest finite values, so every value the HTP can hold passes
unchanged (only an infinity would become 65504). The Clip is named `<Gelu>_apart`; the Gelu keeps its name and
output. Applied by compile to fp16 builds alone (legalize.FP16_RULES), as sigmoid_exp."""
from __future__ import annotations

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "conv_gelu_clip"
OPS = ("Gelu",)
WHAT = "fp16: Gelu(Conv(x)) -> Gelu(Clip(Conv(x), -65504, 65504)) (QNN's fused Conv+Gelu is coarse at fp16)"
FP16_MAX = 65504.0


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for gelu in [n for n in g.graph.node if n.op_type == "Gelu" and n.input]:
        conv = g.producer.get(gelu.input[0])
        if conv is None or conv.op_type != "Conv":
            continue
        base = gelu.name or gelu.output[0]
        lo = g.add_const(f"{base}_lo", np.array(-FP16_MAX, np.float32))
        hi = g.add_const(f"{base}_hi", np.array(FP16_MAX, np.float32))
        gelu.input[0] = g.node("Clip", [gelu.input[0], lo, hi], f"{base}_apart").output[0]
        done += 1
    if done:
        g.reindex()
        g.prune()  # ordered: the Clips were appended after their Gelus
    return done
