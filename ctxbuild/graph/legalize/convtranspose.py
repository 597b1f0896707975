"""Grouped ConvTranspose with output_padding -> the same ConvTranspose with that padding taken off pads' end.

Not an op the HTP refuses, an op it computes wrongly: a depthwise ConvTranspose (group 64, kernel 1x3, stride
1x2, pads 1, output_padding 1, as DeepFilterNet3's ERB decoder has two) gave cosine -0.04 on the simulator at
fp16, while the same op without output_padding, or dense, matched (69 dB). When pads' end is at least
output_padding, the extra output positions lie inside the full (uncropped) output: cropping less at the end
computes exactly them, so the rewrite is bit-exact."""
from __future__ import annotations

from typing import Any

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "convtranspose"
OPS = ("ConvTranspose",)
WHAT = "grouped ConvTranspose with output_padding -> pads' end reduced by it (the HTP computes it wrongly)"


def wanted(g: GraphView) -> bool:
    return any(_movable(n) for n in g.graph.node if n.op_type == "ConvTranspose")


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    from onnx import helper

    done = 0
    for n in [n for n in g.graph.node if n.op_type == "ConvTranspose" and _movable(n)]:
        a = _attrs(n)
        k = len(a["output_padding"])
        pads = list(a["pads"][:k]) + [e - p for e, p in zip(a["pads"][k:], a["output_padding"])]
        kept = [x for x in n.attribute if x.name not in ("pads", "output_padding")]
        del n.attribute[:]
        n.attribute.extend(kept + [helper.make_attribute("pads", pads)])
        done += 1
    return done


def _attrs(n: Any) -> dict[str, Any]:
    from onnx import helper

    return {x.name: helper.get_attribute_value(x) for x in n.attribute}


def _movable(n: Any) -> bool:
    """Grouped, explicit pads whose end covers output_padding (nothing to add beyond the full output), and
    output_padding below the stride (onnxruntime refuses the others; moved into pads they would run)."""
    a = _attrs(n)
    op, pads = list(a.get("output_padding") or []), list(a.get("pads") or [])
    strides = list(a.get("strides") or [1] * len(op))
    return (a.get("group", 1) > 1 and any(op) and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
            and "output_shape" not in a and len(pads) == 2 * len(op) == 2 * len(strides)
            and all(e >= p for e, p in zip(pads[len(op):], op)) and all(p < s for p, s in zip(op, strides)))
