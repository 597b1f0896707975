"""RMSNorm written out (Pow(x, 2) or Mul(x, x) -> ReduceMean -> Add eps -> Sqrt -> Div -> Mul) -> SimplifiedLayerNormalization.

Not an op the HTP refuses, an op it gets wrong in fp16: T5-style residual streams reach ~6e4 and their
square overflows fp16 (a T5 encoder verified at cosine -0.003 on the simulator). The fused op is QNN's RmsNorm,
which the EP maps whole. The fusion is onnxruntime's own (its transformer optimizer's), nothing hand-matched."""
from __future__ import annotations

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "rmsnorm"
OPS = ("ReduceMean",)
WHAT = "RMSNorm written out with Pow/ReduceMean/Sqrt -> SimplifiedLayerNormalization (fp16 overflow)"


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    from onnxruntime.transformers.fusion_simplified_layernorm import FusionSimplifiedLayerNormalization
    from onnxruntime.transformers.onnx_model import OnnxModel

    before = sum(n.op_type == "SimplifiedLayerNormalization" for n in g.graph.node)
    FusionSimplifiedLayerNormalization(OnnxModel(g.model)).apply()
    g.reindex()
    return sum(n.op_type == "SimplifiedLayerNormalization" for n in g.graph.node) - before
