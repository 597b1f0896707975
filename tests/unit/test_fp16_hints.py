"""Hints on a failed fp16 build lead to a fix: no split_outputs (fp16 has no scale to split) and, where no value
leaves fp16's range, the search rather than one integer precision (measured on real models, docs/legalization.md)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ctxbuild.verify.advice import failure_hint, likely_fix

THRESHOLDS = {"min_cosine": 0.999, "min_snr_db": 30.0}


def _detector_output(tmp: Path) -> tuple[Path, dict, list[dict[str, np.ndarray]]]:
    """A one-node model and a verify result whose score slice (a concatenated output's 4:22) failed."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["output0"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 22, 8])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 22, 8])])
    path = tmp / "detector.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    slices = [{"slice": "boxes", "start": 0, "stop": 4, "cosine": 1.0, "snr_db": 48.5},
              {"slice": "scores", "start": 4, "stop": 22, "cosine": 0.9958, "snr_db": 18.6}]
    result = {"outputs": {"output0": {"cosine": 1.0, "snr_db": 48.5, "slices": slices}}, "thresholds": THRESHOLDS}
    x = np.random.default_rng(0).normal(size=(1, 22, 8)).astype(np.float32)
    return path, result, [{"x": x}]


def test_a_weak_slice_at_fp16_is_not_sent_to_split_outputs(tmp_path: Path) -> None:
    """NudeNet's YOLOv8n at fp16: its score slice failed (18.6 dB) and the hint said compile.split_outputs "gives
    each part its own quantization scale"; built so, the figures were the same to the digit. At int16 the hint
    stays (one 16-bit scale over boxes in pixels and scores is what split_outputs cures)."""
    model, result, samples = _detector_output(tmp_path)
    fp16 = failure_hint(model, model, samples, {}, result, recipe="det", precision="fp16")
    assert "split_outputs" not in fp16 and "loses accuracy on the HTP itself" in fp16, fp16
    quantized = failure_hint(model, model, samples, {}, result, recipe="det", precision="int16")
    assert "compile.split_outputs: true" in quantized, quantized


def test_fp16_rounding_loss_points_at_the_search() -> None:
    """PP-OCRv6's recognizer at fp16 (18.7 dB, no value near fp16's limits): the hint said precision: w8a16, which
    fails too (w8a16: 8.1 dB on the CPU); the search finds w16a16 (27.2 dB). A range cause keeps its own fix."""
    worst = [{"node": "Softmax.2", "op_type": "Softmax"}, {"node": "Identity.193", "op_type": "Reshape"}]
    hint = likely_fix("htp", worst, {}, {}, 0)
    assert "precision: auto" in hint and "precision: w8a16" not in hint and "Softmax.2 (Softmax)" in hint, hint
    overflow = likely_fix("htp", worst, {}, {}, 0, ("fp16 overflow: Pow.4 (Pow) computes values up to 7e4", "int16"))
    assert overflow.startswith("fp16 overflow") and "precision: auto" not in overflow, overflow
