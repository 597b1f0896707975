"""Exact GELU written out (x * 0.5 * (1 + Erf(x / sqrt 2)), the way PyTorch exports it) -> one Gelu node.

The HTP takes Erf at fp16 but refuses it in a quantized graph (a ViT and a BERT-style embedder at int16);
QNN's Gelu is accepted both ways. The fusion is onnxruntime's own (its transformer optimizer's FusionGelu).
It writes com.microsoft Gelu, which onnx's shape inference does not know: the quantizer then finds no type for
anything after it and stops (a Softmax "is not an existing tensor"). So the model moves to opset 20 first (onnx's
version converter, as the quantizer itself does for 16-bit types) and the node becomes the standard Gelu.

The fusion takes a divisor within 1e-3 of sqrt(2) (or a factor within 1e-3 of 1/sqrt(2)): only those equal to
float precision (CONSTANT_TOLERANCE) are fused here, and only when the fused node reads the value the Erf's
argument was made from."""
from __future__ import annotations

import math
from typing import Any

from ctxbuild.errors import ActionError, cause_line
from ctxbuild.graph.legalize.graphview import GraphView

NAME = "gelu"
OPS = ("Erf",)
WHAT = "Erf GELU (x * 0.5 * (1 + Erf(x / sqrt 2))) -> Gelu (opset 20)"
GELU_OPSET = 20
CONSTANT_TOLERANCE = 1e-5  # relative: the Gelu op's erf argument then moves by as much, the output by less


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    from onnxruntime.transformers.fusion_gelu import FusionGelu
    from onnxruntime.transformers.onnx_model import OnnxModel

    if not any(n.op_type == "Erf" for n in g.graph.node):
        return 0
    if g.opset < GELU_OPSET:
        _convert(g)
    class Exact(FusionGelu):
        def fuse(self, erf: Any, input_name_to_nodes: dict, output_name_to_node: dict) -> None:
            removed, added = len(self.nodes_to_remove), len(self.nodes_to_add)
            super().fuse(erf, input_name_to_nodes, output_name_to_node)
            if len(self.nodes_to_add) > added and (why := _inexact(g, erf, self.nodes_to_add[-1])):
                del self.nodes_to_remove[removed:], self.nodes_to_add[added:]
                g.keep(erf, why)

    before = sum(n.op_type == "Gelu" for n in g.graph.node)
    Exact(OnnxModel(g.model)).apply()
    for n in g.graph.node:
        if n.op_type == "Gelu" and n.domain == "com.microsoft":
            n.domain = ""  # the same function (approximate="none"), in the standard domain
    g.reindex()
    return sum(n.op_type == "Gelu" for n in g.graph.node) - before


def _inexact(g: GraphView, erf: Any, fused: Any) -> str | None:
    """Why the Gelu node `fused` would not compute what the Erf chain around `erf` does, or None."""
    arg = g.producer.get(erf.input[0])  # Div(x, sqrt 2), Div(x, Sqrt(2)) or Mul(x, 1/sqrt 2)
    if arg is None or arg.op_type not in ("Div", "Mul"):
        return "the Erf's argument is not x / sqrt(2)"
    if arg.op_type == "Div":
        x, c, want = arg.input[0], g.const(arg.input[1]), math.sqrt(2)
        root = g.producer.get(arg.input[1])
        if c is None and root is not None and root.op_type == "Sqrt" and g.const(root.input[0]) is not None:
            c = g.const(root.input[0]) ** 0.5
    else:
        consts = [g.const(i) for i in arg.input]
        k = 0 if consts[0] is not None else 1  # the constant factor; x is the other
        x, c, want = arg.input[1 - k], consts[k], math.sqrt(0.5)
    if c is None or c.size != 1 or abs(float(c.item()) - want) > CONSTANT_TOLERANCE * want:
        return f"the Erf's argument is not x / sqrt(2) to float precision ({'x' if c is None else c.item()!r})"
    if fused.input[0] != x:
        return f"the fused op would read '{fused.input[0]}', the Erf's argument is made from '{x}'"
    return None


def _convert(g: GraphView) -> None:
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(g.model, GELU_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter raises untyped errors naming the op
        raise ActionError(f"legalize rule gelu: onnx could not convert the model from opset {g.opset} to "
                          f"{GELU_OPSET} for the Gelu op ({cause_line(e, limit=200)})",
                          "export the model at opset 20 or later") from None
    g.replace(converted)
