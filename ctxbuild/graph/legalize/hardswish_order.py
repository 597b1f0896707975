"""fp16 only: a HardSwish written `Mul(x, HardSigmoid(x))` (alpha 1/6, beta 0.5) -> the Mul's inputs swapped.

onnxruntime-qnn 2.7.0 computes that pattern wrongly at fp16: x * HardSwish(x) instead of HardSwish(x) (its
HardSigmoidMulFusion, documented for `HardSigmoid(1/6, 0.5) -> Mul` with a shared input, turns the HardSigmoid into
a HardSwish and keeps the Mul). Measured on the SM8650 simulator, [1, 8] inputs N(0, 2), 4 samples: Mul(x, h)
-3.4 dB, Mul(h, x) 65.2 dB, the ONNX HardSwish op 59.0 dB; quantized (w8a16) 90.4 dB in either order; with
PaddlePaddle's alpha 0.166666701 (not float32 1/6) the fusion does not fire (70.2 dB, N(0, 3)). The EP's op trace lists
the same three QNN ops in both orders (qnn/optrace.py): only the result shows it.

The same function, bit for bit (IEEE multiplication commutes); the Mul keeps its name and output. Applied by compile
to fp16 builds alone (legalize.FP16_RULES), as sigmoid_exp."""
from __future__ import annotations

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "hardswish_order"
OPS = ("HardSigmoid",)
WHAT = "fp16: Mul(x, HardSigmoid(x)) -> Mul(HardSigmoid(x), x) (QNN's fp16 HardSwish fusion computes x * HardSwish(x))"


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for hs in [n for n in g.graph.node if n.op_type == "HardSigmoid" and _fused_form(n)]:
        for mul in g.consumers.get(hs.output[0], []):
            if mul.op_type == "Mul" and list(mul.input) == [hs.input[0], hs.output[0]]:
                mul.input[0], mul.input[1] = hs.output[0], hs.input[0]
                done += 1
    return done


def _fused_form(node: object) -> bool:
    """alpha float32(1/6) and beta 0.5, the attributes' values as written (HardSigmoid's defaults are 0.2, 0.5)."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}  # type: ignore[attr-defined]
    return np.float32(attrs.get("alpha", 0.2)) == np.float32(1 / 6) and np.float32(attrs.get("beta", 0.5)) == 0.5
