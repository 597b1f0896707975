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
