"""RMSNorm written out (Pow(x, 2) -> ReduceMean -> Add eps -> Sqrt -> Div -> Mul) -> SimplifiedLayerNormalization.

Not an op the HTP refuses, an op it gets wrong in fp16: T5-style residual streams reach ~6e4 and their
square overflows fp16 (a T5 encoder verified at cosine -0.003 on the simulator). The fused op is QNN's RmsNorm,
which the EP maps whole. The fusion is onnxruntime's own (its transformer optimizer's). A LayerNorm written out
has the same tail after its mean is subtracted; those are left alone: centred values do not overflow, and the
quantizer's opset conversion knows no SimplifiedLayerNormalization (a ViT at int16 would stop there)."""
from __future__ import annotations

from typing import Any

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "rmsnorm"
OPS = ("ReduceMean",)
WHAT = "RMSNorm written out with Pow/ReduceMean/Sqrt -> SimplifiedLayerNormalization (fp16 overflow)"


def wanted(g: GraphView) -> bool:
    """A ReduceMean of a square (Pow, or Mul(x, x)) of an input that is not centred, then Add and Sqrt."""
    for mean in (n for n in g.graph.node if n.op_type == "ReduceMean"):
        sq = g.producer.get(mean.input[0])
        uses = g.consumers.get(mean.output[0], [])
        if sq is not None and sq.op_type in ("Pow", "Mul") and not _centred(sq.input[0], g.producer) and \
                any(u.op_type == "Add" and any(v.op_type == "Sqrt" for v in g.consumers.get(u.output[0], []))
                    for u in uses):
            return True
    return False


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    from onnxruntime.transformers.fusion_simplified_layernorm import FusionSimplifiedLayerNormalization
    from onnxruntime.transformers.onnx_model import OnnxModel

    class RmsOnly(FusionSimplifiedLayerNormalization):
        def fuse(self, node: Any, input_name_to_nodes: dict, output_name_to_node: dict) -> None:
            removed, added = len(self.nodes_to_remove), len(self.nodes_to_add)
            super().fuse(node, input_name_to_nodes, output_name_to_node)
            if len(self.nodes_to_add) > added and _centred(self.nodes_to_add[-1].input[0], output_name_to_node):
                del self.nodes_to_remove[removed:], self.nodes_to_add[added:]

    before = sum(n.op_type == "SimplifiedLayerNormalization" for n in g.graph.node)
    RmsOnly(OnnxModel(g.model)).apply()
    g.reindex()
    return sum(n.op_type == "SimplifiedLayerNormalization" for n in g.graph.node) - before


def _centred(name: str, producer: dict) -> bool:
    """`name` = Sub(x, ReduceMean(x)), perhaps moved by a Transpose the optimizer put there: centred."""
    sub = producer.get(name)
    while sub is not None and sub.op_type in ("Transpose", "Reshape"):
        sub = producer.get(sub.input[0])
    if sub is None or sub.op_type != "Sub":
        return False
    mean = producer.get(sub.input[1])
    return mean is not None and mean.op_type == "ReduceMean" and mean.input[0] == sub.input[0]


def unfuse(model: Any) -> int:
    """Write each SimplifiedLayerNormalization out again as plain ops (x / sqrt(mean(x*x) + eps) * scale), in
    place; returns how many. For the quantizer: it moves 16-bit models to opset 21 and onnx's converter has no
    schema for onnxruntime's op, and quantized activations have a scale, not fp16's range, so the written-out
    form does not overflow there."""
    import numpy as np
    from onnx import helper, numpy_helper

    g = GraphView(model)
    fused = [n for n in g.graph.node if n.op_type == "SimplifiedLayerNormalization" and len(n.output) == 1]
    done = 0
    for n in fused:
        attr = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        x, scale, y = n.input[0], n.input[1], n.output[0]
        axis = attr.get("axis", -1)
        if axis >= 0:
            continue  # normalized from a leading axis: not an RMSNorm the rule fuses; the quantizer names it
        axes = list(range(axis, 0))
        eps = g.fresh(f"{n.name}_eps")
        g.graph.initializer.append(numpy_helper.from_array(np.array(attr.get("epsilon", 1e-5), np.float32), eps))
        t = {k: g.fresh(f"{n.name}_{k}") for k in ("sq", "ms", "mse", "rms", "xn")}
        mean = (helper.make_node("ReduceMean", [t["sq"], _axes(g, n.name, axes)], [t["ms"]], keepdims=1)
                if g.opset >= 18 else helper.make_node("ReduceMean", [t["sq"]], [t["ms"]], axes=axes, keepdims=1))
        nodes = [helper.make_node("Mul", [x, x], [t["sq"]]), mean, helper.make_node("Add", [t["ms"], eps], [t["mse"]]),
                 helper.make_node("Sqrt", [t["mse"]], [t["rms"]]), helper.make_node("Div", [x, t["rms"]], [t["xn"]]),
                 helper.make_node("Mul", [t["xn"], scale], [y])]
        for k, node in enumerate(nodes):
            node.name = f"{n.name}/{node.op_type}_{k}"
        at = list(g.graph.node).index(n)
        g.graph.node.remove(n)
        for k, node in enumerate(nodes):
            g.graph.node.insert(at + k, node)
        done += 1
    if done:
        g.reindex()
    return done


def _axes(g: GraphView, name: str, axes: list[int]) -> str:
    import numpy as np
    from onnx import numpy_helper

    t = g.fresh(f"{name}_axes")
    g.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), t))
    return t
