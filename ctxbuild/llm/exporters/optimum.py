"""optimum / torch.onnx's decoder convention: already the canonical form (plain ONNX ops, `position_ids` given)."""
from __future__ import annotations

from typing import Any

from ctxbuild.llm.exporters.base import Exporter


class Optimum(Exporter):
    name = "optimum"
    inputs = ("input_ids", "attention_mask", "position_ids")
    fallback = True  # the canonical form itself: anything no other convention claims is checked as this one

    @classmethod
    def matches(cls, model: Any) -> bool:
        return True
