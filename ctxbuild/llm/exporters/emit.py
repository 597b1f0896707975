"""What the exporter plug-ins write into a graph they rewrite: nodes with scoped names, shared constants, and the
canonical additive mask (llm/canonical.py) built once from `attention_mask` and `position_ids`."""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ctxbuild.graph.nodenames import KEY
from ctxbuild.llm.canonical import MASK_NEG


class Emit:
    """Nodes for graph `g` (collected in `nodes`, placed by the caller), constants added to its initializers."""

    def __init__(self, g: Any) -> None:
        self.g, self.nodes, self.n = g, [], 0
        self.inits = {t.name for t in g.initializer}
        self.replacing = ""  # the export's node the nodes emitted now take the place of ("": none)
        self.origin: dict[str, str] = {}  # emitted node -> that node: what a refusal names (graph/nodenames.py)

    def const(self, name: str, value: Any) -> str:
        from onnx import numpy_helper

        if name not in self.inits:
            self.g.initializer.append(numpy_helper.from_array(np.asarray(value), name))
            self.inits.add(name)
        return name

    def op(self, op: str, inputs: list[str], scope: str, outputs: list[str] | None = None, **attrs: Any) -> str:
        from onnx import helper

        self.n += 1
        name = f"{scope}/{op}_lowered_{self.n}"
        if self.replacing:
            self.origin[name] = self.replacing
        outs = outputs or [name + "_output_0"]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0]

    def mask(self) -> str:
        """The additive mask [batch, 1, seq, past + seq]: 0 where a key is at or before the query's position and
        valid in `attention_mask`, MASK_NEG elsewhere (the static pass makes it an input)."""
        s = "/model/attn_mask"
        total = self.op("Gather", [self.op("Shape", ["attention_mask"], s), self.const("lowered_one", np.int64(1))],
                        s, axis=0)
        key_pos = self.op("Reshape", [self.op("Range", [self.const("lowered_zero", np.int64(0)), total, "lowered_one"], s),
                                      self.const("lowered_shape_1_1_1_m1", np.array([1, 1, 1, -1], np.int64))], s)
        causal = self.op("LessOrEqual", [key_pos, self.op("Unsqueeze", [
            "position_ids", self.const("lowered_axes_1_3", np.array([1, 3], np.int64))], s)], s)
        valid = self.op("Equal", [self.op("Unsqueeze", [
            "attention_mask", self.const("lowered_axes_1_2", np.array([1, 2], np.int64))], s), "lowered_one"], s)
        return self.op("Where", [self.op("And", [causal, valid], s), self.const("lowered_mask_zero", np.float32(0)),
                                 self.const("lowered_mask_neg", np.float32(MASK_NEG))], s)

    def stamp(self, model: Any) -> None:
        """Record in `model` the export's node each emitted node took the place of, as prepare records its rewrites
        (graph/nodenames.py): the static graphs keep it for the nodes they hold."""
        from onnx import helper

        helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                       KEY: json.dumps({"from": {n: [u] for n, u in self.origin.items()}})})
