"""Attention-mask fill values (Where(mask, 0, -inf or -3.4e38) added to Softmax logits) -> -100.

Not an op the HTP refuses: a value quantization cannot hold. Calibration takes the fill value into the range
of the masked logits, so with -3.4e38 every real logit rounds to one step (a BERT-style embedder at int16:
cosine 0.28). exp(-100) underflows float32 like exp(-inf) does, so the float model keeps its outputs as long
as no logit is 100 above another (attention logits are tens at most); the rewrite is checked on samples."""
from __future__ import annotations

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "mask_fill"
OPS = ("Where",)
WHAT = "attention-mask fill (-inf, -3.4e38, -1e9 ...) added to Softmax logits -> -100"
FILL = -100.0
HUGE = -1e4  # fills at or below this are masks, not values


def wanted(g: GraphView) -> bool:
    return any(n.op_type == "Where" and _feeds_softmax(g, n.output[0]) for n in g.graph.node)


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Where"]:
        if not _feeds_softmax(g, node.output[0]):
            continue
        for k in (1, 2):
            value = g.const(node.input[k])
            if value is not None and value.size == 1 and value.dtype.kind == "f" and float(value.item()) <= HUGE:
                node.input[k] = g.add_const(f"{node.input[k]}_mask", np.full(value.shape, FILL, value.dtype))
                done += 1
    return done


def _feeds_softmax(g: GraphView, name: str, depth: int = 3) -> bool:
    """Every use of `name` is an Add whose result reaches a Softmax through Adds only."""
    uses = g.consumers.get(name, [])
    if not uses or depth == 0:
        return False
    return all(u.op_type == "Softmax" or (u.op_type == "Add" and _feeds_softmax(g, u.output[0], depth - 1))
               for u in uses)
