"""The additive attention mask applied so that a masked score is below every score of its row, whatever the model.

The static graphs take the mask as an input of 0 and MASK_NEG (llm/canonical.py), small so that the 16-bit range of
the masked scores keeps its resolution. Added to the scores, a masked slot stays MASK_NEG from its own score, which
a model with large score offsets beats: Qwen2.5-Coder-0.5B's float static graphs chose other tokens than its export on
3 of 8 prompts at MASK_NEG = -100 (an empty cache slot's key is zeros, its score 0, above valid scores far below it;
-300 to -500 was needed). Rewritten, each `Add(scores, attention_mask)` becomes
`Where(attention_mask < MASK_NEG / 2, ReduceMin(scores) + MASK_NEG, scores)`: a masked slot sits MASK_NEG below the
row's lowest score, so its weight after the Softmax is below e^MASK_NEG of the row's largest, as the export's
-inf or dtype-minimum masks give, while the range the quantizer sees is still the row's spread plus |MASK_NEG|."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.llm.canonical import MASK_NEG

INPUT = "attention_mask"


def below_row_min(m: Any) -> dict[str, str]:
    """Rewrite every Add of the attention_mask input (and a score tensor) in place; returns each added node's
    name -> the Add's (the node it replaced, for the names a refusal speaks)."""
    from onnx import helper, numpy_helper

    g = m.graph
    adds = [n for n in g.node if n.op_type == "Add" and INPUT in n.input and len(set(n.input)) == 2]
    if not adds:
        return {}
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    consts = {"lowered_mask_half": np.float32(MASK_NEG / 2), "lowered_mask_below": np.float32(MASK_NEG),
              "lowered_axes_m1": np.array([-1], np.int64)}
    have = {t.name for t in g.initializer}
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items() if k not in have)
    masked = f"{INPUT}/lowered_masked"
    nodes, added = list(g.node), {}
    first = min(nodes.index(n) for n in adds)
    nodes.insert(first, helper.make_node("Less", [INPUT, "lowered_mask_half"], [masked], name=masked))
    for add in adds:
        scores = next(i for i in add.input if i != INPUT)
        base = add.name or add.output[0]
        low = (helper.make_node("ReduceMin", [scores, "lowered_axes_m1"], [f"{base}/row_min"], keepdims=1,
                                name=f"{base}/ReduceMin_lowered") if opset >= 18 else
               helper.make_node("ReduceMin", [scores], [f"{base}/row_min"], axes=[-1], keepdims=1,
                                name=f"{base}/ReduceMin_lowered"))
        below = helper.make_node("Add", [f"{base}/row_min", "lowered_mask_below"], [f"{base}/below"],
                                 name=f"{base}/Add_lowered")
        where = helper.make_node("Where", [masked, f"{base}/below", scores], list(add.output), name=add.name)
        at = nodes.index(add)
        nodes[at:at + 1] = [low, below, where]
        added.update({low.name: add.name, below.name: add.name})
    added[masked] = adds[0].name
    del g.node[:]
    g.node.extend(nodes)
    return {k: v for k, v in added.items() if v}
