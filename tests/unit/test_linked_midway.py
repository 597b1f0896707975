"""A weight file that gains a hard link while the quantizer runs: a compile of the same prepared model stages its
`.data` by hard link (qnn/staging.py), so with -j2 an fp16 compile beside an integer candidate's quantize made the
file's link count 2 after private_input had found 1 and used it in place; onnx's loader then refused it ("multiple
hard links, indicating a potential hardlink attack") and the build failed (a Khmer segmenter from khmersm 1.4.2,
its first cold build; the rebuild passed)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ctxbuild.actions.quantize import private_input, quantize_model
from ctxbuild.graph.modelio import data_path
from ctxbuild.recipes.quantization import settings as quantization
from tests.e2e.test_linked_weights import mlp


@pytest.mark.parametrize("nodes", [{}, {"r": "fp16"}])  # a pin: the quantizer reads a rewritten copy (-unfused-)
def test_quantize_survives_a_link_made_midway(tmp_path: Path, nodes: dict) -> None:
    model = tmp_path / "work" / "m.onnx"
    model.parent.mkdir()
    mlp(model)
    fresh = tmp_path / "fresh" / "m.onnx"
    fresh.parent.mkdir()
    mlp(fresh)
    settings = quantization({"activations": "uint8", "weights": "uint8", "nodes": nodes})
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 64)).astype(np.float32)} for i in range(4)]
    listing = sorted(p.name for p in model.parent.iterdir())
    stage = tmp_path / "stage"
    stage.mkdir()
    outputs = {}
    for name, src in (("midway", model), ("fresh", fresh)):
        dst = tmp_path / f"q-{name}" / "q.onnx"
        dst.parent.mkdir()
        with private_input(src) as private:
            if name == "midway":  # what a compile's stage does, after private_input looked
                os.link(data_path(model), stage / data_path(model).name)
            quantize_model(private, dst, settings, samples, "test.yaml")
        outputs[name] = dst.read_bytes(), data_path(dst).read_bytes()
    assert outputs["midway"] == outputs["fresh"]
    assert sorted(p.name for p in model.parent.iterdir()) == listing  # no private copy, proto or scratch left
