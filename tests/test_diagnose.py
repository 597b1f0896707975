"""Per-layer diagnosis (`ctxbuild verify --layers`): where accuracy goes, quantization vs the HTP."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests._sliced_model import write_tree


def _flat_calibration(tree: Path) -> None:
    """tiny_cnn calibrated on all-zero images: quantization ruins it (the QDQ model fails on the CPU too)."""
    for p in tree.glob("*.yaml"):
        if p.name != "_defaults.yaml":
            p.unlink()
    (tree / "flat").mkdir()
    for i in range(4):
        np.savez(tree / "flat" / f"s{i}.npz", image=np.zeros((1, 3, 64, 64), np.float32))
    (tree / "flat.yaml").write_text(
        "model: models/tiny_cnn.onnx\ninputs: {image: [1, 3, 64, 64]}\nprecision: int16\n"
        "calibration: {dir: flat}\ntargets: [SM8650]\nverify: {dir: models/calib/tiny_cnn}\n")


def test_quantization_loss_is_named_per_node(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _flat_calibration(tree)
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1
    line = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED verify/flat@SM8650"))
    # the hint, from the CPU half: calibrated on zeros, conv1's bias cannot fit its int32 scale
    assert "quantization loses it: the biases of conv1" in line and "calibration samples" in line
    assert "verify --layers flat" in line

    r = ctxbuild("verify", "--layers", "flat", str(tree), "-o", str(out))
    assert r.code == 1  # the verification itself still fails
    d = json.loads((out / "SM8650" / "flat" / "flat_layers.json").read_text())
    assert d["where"] == "quantization" and d["graph"] == "flat" and d["target"] == "SM8650"
    q = d["outputs"]["logits"]["quantization"]
    assert q["snr_db"] < 20  # float vs QDQ on the CPU already fails ...
    assert d["outputs"]["logits"]["htp"]["snr_db"] > q["snr_db"]  # ... while the HTP adds little to it
    worst = d["worst_quantization"]
    names = {n["node"] for n in worst}
    assert names <= {"conv1", "bn1", "relu1", "conv2", "relu2", "gap", "flatten", "fc"} and names
    assert all(n["quant_snr_db"] is not None and n["quant_added_db"] is not None for n in worst)
    assert any(n["htp_snr_db"] is not None for n in worst)  # probed on the simulator
    assert d["probe_runs"][0]["probes"] >= len(worst) and d["probe_runs"][0]["partitions"] == 1
    assert "quantization loses it" in d["hint"] and "conv1" in d["hint"] and worst[0]["node"] in d["hint"]
    assert "worst in quantization" in r.out and worst[0]["node"] in r.out and "HTP SNR" in r.out
    report = json.loads((out / "report.json").read_text())
    v = next(v for row in report["rows"] for v in row["verify"] if v["id"] == "verify/flat@SM8650")
    assert v["layers"]["where"] == "quantization" and v["layers"]["worst"][0]["node"] == worst[0]["node"]
    assert "Per-layer diagnosis" in (out / "report.html").read_text()


def test_float_model_loss_is_the_htps(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """fp16: no quantization step, so every bit of loss the diagnosis finds is the HTP's."""
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "mlp_fp16", "--target", "SM8650", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    d = json.loads((out / "SM8650" / "mlp_fp16" / "mlp_fp16_layers.json").read_text())
    assert d["where"] == "htp"
    assert all(row["quantization"]["snr_db"] == 120 for row in d["outputs"].values())
    assert d["worst_quantization"] == [] and d["worst_htp"]
    assert all(20 < n["htp_snr_db"] < 120 for n in d["worst_htp"])
    assert len(d["worst_htp"]) > 1  # intermediate tensors probed too, not only the output
    assert not (out / "SM8750" / "mlp_fp16" / "mlp_fp16_layers.json").exists()  # --target


def test_weak_slice_diagnosis_points_at_split(tmp_path: Path, ctxbuild) -> None:
    tree = write_tree(tmp_path / "recipes", {"det": ""})
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "det", str(tree), "-o", str(out))
    assert r.code == 1
    d = json.loads((out / "SM8650" / "det" / "det_layers.json").read_text())
    q = d["outputs"]["detections"]["quantization"]
    assert [s["slice"] for s in q["slices"]] == ["boxes_flat", "scores_flat"] and q["slices"][1]["snr_db"] < 12
    assert d["where"] == "quantization" and "compile.split_outputs: true" in d["hint"]
    # the debug build's extra outputs may change what QNN fuses: recorded, not assumed away
    assert "debug_vs_delivered_snr_db" in d["probe_runs"][-1]


def test_layers_needs_a_known_recipe(tree: Path, tmp_path: Path, ctxbuild) -> None:
    r = ctxbuild("verify", "--layers", "nope", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2 and "--only nope: no such recipe" in r.err
