"""QNN_COMMON_ERROR_MEM_ALLOC at finalize said only QNN's code. The hint names compile.optimization_mode, which
compiled khmersm's Khmer segmenter at int16 (tests/slow/test_real_families.py pastes it); this quantized Conv1d of 128
channels x dilation 2048 is refused at every mode, and builds once prepare's dilated_conv folds it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tests.e2e.test_legalize import _model, rng


def _recipe(root: Path, extra: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    w = (rng().standard_normal((128, 128, 3)) / np.sqrt(384)).astype(np.float32)
    onnx.save(_model([helper.make_node("Conv", ["x", "w"], ["y"], dilations=[2048])], {"x": [1, 128, 4596]},
                     {"y": [1, 128, 500]}, {"w": w}), str(root / "dilated.onnx"))
    (root / "dilated.yaml").write_text("model: dilated.onnx\ntargets: [SM8650]\nprecision: w8a16\n"
                                       f"calibration: {{random: true}}\nverify: false\n{extra}")
    return root


def test_mem_alloc_hint_names_the_optimization_mode(tmp_path: Path, ctxbuild) -> None:
    r = ctxbuild("build", str(_recipe(tmp_path / "a", "prepare: {rewrite: false}\n")), "-o", str(tmp_path / "out_a"))
    assert r.code == 1 and "QNN_COMMON_ERROR_MEM_ALLOC" in r.err, r.text
    assert "try compile: {optimization_mode: 1}" in r.err, r.err
    r = ctxbuild("build", str(_recipe(tmp_path / "b", "")), "-o", str(tmp_path / "out_b"))
    assert r.code == 0, r.text
