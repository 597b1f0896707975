"""The decoders' RMSNorms kept whole: SimplifiedLayerNormalization, onnxruntime's op, which the QNN EP maps to the
HTP's RmsNorm. The genai builder writes them so; the rmsnorm rule fuses those an exporter wrote out (x*x,
ReduceMean, Add, Sqrt, Div, Mul). Quantized written out, x*x takes one uint16 scale over a trained decoder's massive
activation (SmolLM2-135M writes ~2.6e4 at one prompt position: x*x ~6e8, a step of ~9,000) and every other token's
mean square rounds to 0; fused, only x and the output are quantized (measured on a row of N(0, 3) beside one
such value, onnxruntime-qnn 2.7.0, v68-v81: cosine 0.676 on the CPU / 0.640 on the simulator written out, 0.9991 /
0.9991 fused). onnx has no schema for the op: inference and the opset converter see it as Mul(x, scale)."""
from __future__ import annotations

from typing import Any, Callable

OP = "SimplifiedLayerNormalization"
QDQ_OPSET = 21  # 16-bit QuantizeLinear/DequantizeLinear; onnxruntime's quantizer converts a model under it


def through_norms(m: Any, fn: Callable[[Any], Any]) -> Any:
    """fn(m) (onnx's shape inference or version converter; it returns a new model) with each norm posing as
    Mul(x, scale), which has its shape and type; `m` is left as it was."""
    attrs = {n.output[0]: list(n.attribute) for n in m.graph.node if n.op_type == OP and len(n.output) == 1}

    def pose(model: Any, op: str) -> None:
        for n in model.graph.node:
            if n.output and n.output[0] in attrs:
                del n.attribute[:]
                n.op_type = op
                if op == OP:
                    n.attribute.extend(attrs[n.output[0]])

    pose(m, "Mul")
    try:
        out = fn(m)
    finally:
        pose(m, OP)
    pose(out, OP)
    return out


def at_opset_21(model: Any) -> Any:
    """`model` at opset 21 at least (16-bit QuantizeLinear), converted as onnxruntime's quantizer would, which
    stops at a norm."""
    import onnx

    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= QDQ_OPSET:
        return model
    return through_norms(model, lambda m: onnx.version_converter.convert_version(m, QDQ_OPSET))


def fuse_rmsnorms(m: Any) -> dict[str, str]:
    """The written-out RMSNorms of a static graph (shape inference run: its value_info) fused, in place, their
    outputs typed as their inputs (onnxruntime's calibration records only typed tensors); returns each fused node's
    name -> its ReduceMean's (the rule names it after it), for the names a refusal speaks."""
    from ctxbuild.graph.legalize import rmsnorm
    from ctxbuild.graph.legalize.graphview import GraphView, inferred_shapes

    view = GraphView(m)
    if not rmsnorm.wanted(view):
        return {}
    means = {n.name for n in m.graph.node if n.op_type == "ReduceMean"}
    rmsnorm.apply(view, inferred_shapes(m))
    typed = {v.name: v for v in list(m.graph.value_info) + list(m.graph.input)}
    for n in m.graph.node:
        if n.op_type == OP and n.output[0] not in typed and n.input[0] in typed:
            v = m.graph.value_info.add()
            v.CopyFrom(typed[n.input[0]])
            v.name = n.output[0]
    return {n.name: n.name.removesuffix("_rmsnorm") for n in m.graph.node
            if n.op_type == OP and n.name.removesuffix("_rmsnorm") in means}
