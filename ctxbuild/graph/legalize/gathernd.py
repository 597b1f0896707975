"""GatherND with constant indices -> Reshape + Gather: the HTP has no GatherND.

Exporters write GatherND for index grids computed from shapes (a BERT-style embedder's attention-mask
expansion); once prepare fixed the input shapes and folded constants, the indices are a constant. The
gathered leading axes are flattened into one and the index tuples become flat positions. Only indices in range
of the data's static shape: onnxruntime refuses the others, and as flat positions they would read valid data."""
from __future__ import annotations

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "gathernd"
OPS = ("GatherND",)
WHAT = "GatherND with constant indices -> Reshape + Gather"


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "GatherND"]:
        batch_dims = next((a.i for a in node.attribute if a.name == "batch_dims"), 0)
        idx = g.const(node.input[1])
        shape = shapes.get(node.input[0])
        if batch_dims or idx is None or not shape or any(d <= 0 for d in shape):
            continue
        k = idx.shape[-1]
        lead = np.array(shape[:k], np.int64)
        if k > len(shape) or ((idx < -lead) | (idx >= lead)).any():
            g.keep(node, f"indices out of range for data of shape {shape} (onnxruntime refuses them; as flat "
                         "positions they would read other elements)")
            continue
        idx = np.where(idx < 0, idx + lead, idx).astype(np.int64)  # GatherND takes negative indices
        strides = np.cumprod(np.concatenate([lead[1:], [1]])[::-1])[::-1]
        flat = (idx * strides).sum(-1)
        base = node.name or "gathernd"
        data = g.node("Reshape", [node.input[0], g.add_const(f"{base}_shape", np.array(
            [int(lead.prod())] + list(shape[k:]), np.int64))], f"{base}_flatten").output[0]
        y = g.node("Gather", [data, g.add_const(f"{base}_indices", flat)], f"{base}_gather", axis=0).output[0]
        g.replace_uses(node.output[0], y)
        done += 1
    return done
