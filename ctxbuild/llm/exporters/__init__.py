"""The exporters whose decoders `llm:` recipes take, one plug-in module each (base.py says how to add one)."""
from __future__ import annotations

from typing import Any

from ctxbuild.llm.exporters import genai_builder, optimum, torch_onnx  # noqa: F401 - importing a plug-in registers it
from ctxbuild.llm.exporters.base import REGISTRY, Exporter


def detect(model: Any) -> type[Exporter]:
    """The convention `model` follows: the first specific plug-in that claims it, else the fallback."""
    ordered = [e for e in REGISTRY if not e.fallback] + [e for e in REGISTRY if e.fallback]
    return next(e for e in ordered if e.matches(model))
