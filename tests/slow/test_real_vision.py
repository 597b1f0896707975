"""Real public vision models (PyPI wheels, bench/real_models) at fp16 and precision: auto. Run: pytest -m slow"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.real_models.inputs import write_samples
from bench.real_models.models import MODELS, MissingModel, locate

pytestmark = pytest.mark.slow


def _tree(root: Path, name: str, recipes: dict[str, str]) -> Path:
    """Recipes over model `name` (file stem -> its precision and extra lines), 8 calibration and 4 verification
    samples rendered locally."""
    try:
        model, m = locate(name), MODELS[name]
    except MissingModel as e:
        pytest.skip(str(e))
    for d, n, first in (("cal", 8, 0), ("verify", 4, 100)):
        write_samples(name, root / d, n, first)
    common = f"inputs: {{{m.input}: {list(m.shape)}}}\ncalibration: {{dir: cal}}\ntargets: [SM8650]\n"
    for stem, rest in recipes.items():
        (root / f"{stem}.yaml").write_text(f"model: {model}\n{common}{rest}\nverify: {{dir: verify, timeout_s: 1800}}\n")
    return root


def test_yolov8_detector_at_fp16_and_auto(tmp_path: Path, ctxbuild) -> None:
    """NudeNet's YOLOv8n (320x320, boxes and 18 class scores in one output) on drawn scenes with people (scores up
    to 0.23, as a filter sees most images). At fp16 as written its score slice verified at 0.9958 / 18.6 dB (the
    HTP's fp16 Sigmoid, after each of 57 Convs and over the class logits) and the hint sent the user to
    split_outputs, which changed nothing; with compile's sigmoid_exp rewrite it passes (36.6 dB; 63.0 dB whole).
    precision: auto: the integer candidates miss the score slice on the CPU screen (w8a16 9.6 dB; w16a16 12.9 and
    mixed 13.5 dB, left out here for time), and the search stopped with no candidate; its fp16 rung now wins."""
    tree = _tree(tmp_path / "recipes", "nudenet_320n", {
        "nudenet": "precision: fp16", "nudenet_as_written": "precision: fp16\nprepare: {rewrite: false}",
        "nudenet_auto": "precision: auto\nquantization: [{}]\nauto: {mixed: false}"})
    for seed in (102, 103):  # two simulator samples: the failure and the pass are each clear on them
        (tree / "verify" / f"nudenet_320n_{seed}.npz").unlink()
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "-k", "0", timeout=1800)
    assert r.code == 1, r.text
    failed = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED")]
    assert len(failed) == 1 and "verify/nudenet_as_written@SM8650" in failed[0], r.err
    assert "Sigmoid_output_0" in failed[0] and "split_outputs" not in failed[0], failed[0]
    result = json.loads((out / ".ctxbuild" / "records" / "verify.nudenet@SM8650.json").read_text())["result"]
    boxes, scores = result["outputs"]["output0"]["slices"]
    assert result["passed"] and scores["snr_db"] >= 30 and boxes["snr_db"] >= 30, result["outputs"]
    search = json.loads((out / "SM8650" / "nudenet_auto" / "nudenet_auto_search.json").read_text())
    assert search["winner"] == "fp16", search
    assert [c["state"] for c in search["candidates"]] == ["rejected_cpu", "passed"], search
