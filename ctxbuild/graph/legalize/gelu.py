"""Exact GELU written out (x * 0.5 * (1 + Erf(x / sqrt 2)), the way PyTorch exports it) -> one Gelu node.

The HTP takes Erf at fp16 but refuses it in a quantized graph (a ViT and a BERT-style embedder at int16);
QNN's Gelu is accepted both ways. The fusion is onnxruntime's own (its transformer optimizer's FusionGelu).
It writes com.microsoft Gelu, which onnx's shape inference does not know: the quantizer then finds no type for
anything after it and stops (a Softmax "is not an existing tensor"). So the model moves to opset 20 first (onnx's
version converter, as the quantizer itself does for 16-bit types) and the node becomes the standard Gelu."""
from __future__ import annotations

from ctxbuild.errors import ActionError
from ctxbuild.graph.legalize.graphview import GraphView

NAME = "gelu"
OPS = ("Erf",)
WHAT = "Erf GELU (x * 0.5 * (1 + Erf(x / sqrt 2))) -> Gelu (opset 20)"
GELU_OPSET = 20


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    from onnxruntime.transformers.fusion_gelu import FusionGelu
    from onnxruntime.transformers.onnx_model import OnnxModel

    if not any(n.op_type == "Erf" for n in g.graph.node):
        return 0
    if g.opset < GELU_OPSET:
        _convert(g)
    before = sum(n.op_type == "Gelu" for n in g.graph.node)
    FusionGelu(OnnxModel(g.model)).apply()
    for n in g.graph.node:
        if n.op_type == "Gelu" and n.domain == "com.microsoft":
            n.domain = ""  # the same function (approximate="none"), in the standard domain
    g.reindex()
    return sum(n.op_type == "Gelu" for n in g.graph.node) - before


def _convert(g: GraphView) -> None:
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(g.model, GELU_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter raises untyped errors naming the op
        raise ActionError(f"legalize rule gelu: onnx could not convert the model from opset {g.opset} to "
                          f"{GELU_OPSET} for the Gelu op ({str(e).splitlines()[0][:200]})",
                          "export the model at opset 20 or later") from None
    g.replace(converted)
