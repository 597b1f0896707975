"""The bytes of files a plan's actions will write, predicted before any ran: what memory estimates count for the
actions that read them (plan/memory.planned), so a plan's peak memory is known before hours of building.

Only the files that make an action's estimate: an `llm:` recipe's per-part weight files (llm_split's float32,
llm_quantize's QDQ), from the decoder's weight sizes (recipes/llm.part_weight_bytes); graph files and the rest are
small beside them and count as 0 until written.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.llm.convention import decoder_facts
from ctxbuild.llm.static import weights_role
from ctxbuild.recipes.llm import part_weight_bytes


def planned_sizes(actions: list[Any]) -> dict[str, int]:
    """Predicted bytes by output path, for the outputs of the actions that have not written them yet."""
    sizes: dict[str, int] = {}
    splits = {a.outputs["layout"]: a for a in actions if a.kind == "llm_split"}
    for a in actions:
        split = a if a.kind == "llm_split" else splits.get(a.inputs.get("layout", "")) if a.kind == "llm_quantize" else None
        if split is None:
            continue
        facts = decoder_facts(Path(split.inputs["model"]))
        if not facts or "weight_sizes" not in facts:  # not a decoder ctxbuild reads: the split reports it
            continue
        parts = split.params["parts"]
        if a is split:  # every part's float32 weights (fp16 counts 2 bytes for every matrix, none kept at 8 bits)
            per_part = [2 * b for b in part_weight_bytes(facts, parts, "fp16", None)]
            sizes.update({a.outputs[weights_role(p)]: int(b) for p, b in enumerate(per_part)})
        else:
            p = a.params["part"]
            qdq = part_weight_bytes(facts, parts, a.params["precision"], a.params["keep_8bit"])[p]
            sizes[a.outputs[weights_role(p)]] = int(qdq)
    return {path: n for path, n in sizes.items() if not Path(path).exists()}
