"""Verification on the HTP simulator against the float model: metrics, failures, crashes, reuse."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ctxbuild.verify.measure import SNR_CAP_DB, metrics
from tests.conftest import TINY_CNN, keep_only, last_build, records


def test_examples_verify_with_metrics(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "tiny_cnn.yaml", "mlp_fp16.yaml")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    verifies = {i: rec for i, rec in records(out).items() if rec["kind"] == "verify"}
    assert set(verifies) == {"verify/tiny_cnn@SM8650", "verify/tiny_cnn@SM8750", "verify/tiny_cnn@SC8380XP",
                             "verify/mlp_fp16@SM8650", "verify/mlp_fp16@SM8750"}
    for rec in verifies.values():
        res = rec["result"]
        assert res["passed"] and res["method"] == "direct"
        assert res["coverage"]["cpu_nodes"] == 0 and res["coverage"]["fraction"] == 1.0  # cpu_fallback: false
        for m in res["outputs"].values():
            assert m["cosine"] >= res["thresholds"]["min_cosine"] and m["snr_db"] >= res["thresholds"]["min_snr_db"]
    cnn = verifies["verify/tiny_cnn@SM8650"]["result"]
    assert cnn["sample_source"] == "calibration" and cnn["samples"] == 4
    assert cnn["outputs"]["logits"]["argmax_agreement"] == 1.0
    assert verifies["verify/mlp_fp16@SM8650"]["result"]["sample_source"] == "verification"


def test_constant_calibration_fails_verification(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree)
    cal = tree / "flat"
    cal.mkdir()
    for i in range(4):
        np.savez(cal / f"s{i}.npz", image=np.zeros((1, 3, 64, 64), np.float32))
    (tree / "flat.yaml").write_text(
        TINY_CNN + "precision: w8a16\n"
        "calibration: {dir: flat}\ntargets: [SM8650]\nverify: {dir: models/calib/tiny_cnn}\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1, r.text
    line = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED verify/flat@SM8650"))
    assert "output 'logits' cosine" in line and "(min 0.99)" in line and "SNR" in line
    res = records(out)["verify/flat@SM8650"]["result"]
    assert res["passed"] is False and res["outputs"]["logits"]["cosine"] < 0.99
    assert not (out / "SM8650" / "flat" / "flat_verify.json").exists()


def test_corrupt_binary_in_out_is_restored_before_verify(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """A binary corrupted in OUT once reached the simulator (a failure unrelated to the model, every build);
    it is now put back from the cache before verify runs (issue 19 item 3)."""
    keep_only(tree, "tiny_cnn.yaml")
    out = tmp_path / "out"
    assert ctxbuild("build", str(tree), "-o", str(out)).code == 0
    binf = out / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx_qnn.bin"
    good = binf.read_bytes()
    data = bytearray(good)
    data[len(data) // 3: len(data) // 3 + 4096] = bytes(4096)  # wipe a block in the middle of the graph
    binf.unlink()  # a new file: written in place it would reach the cache's blob (a hard link), which then rebuilds
    binf.write_bytes(bytes(data[: len(data) // 2]))  # and truncate it
    (out / "SM8650" / "tiny_cnn" / "tiny_cnn_verify.json").unlink()
    r = ctxbuild("verify", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert binf.read_bytes() == good
    assert last_build(out)["compile/tiny_cnn@SM8650"] == "cache"


def test_verify_command_reuses_cached_results(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    assert ctxbuild("build", str(tree), "-o", str(out)).code == 0
    r = ctxbuild("verify", str(tree), "-o", str(out))
    assert r.code == 0 and "ctxbuild: up to date" in r.out
    for p in out.glob("*/mlp_fp16/mlp_fp16_verify.json"):
        p.unlink()
    r = ctxbuild("verify", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert last_build(out) == {"verify/mlp_fp16@SM8650": "cache", "verify/mlp_fp16@SM8750": "cache"}
    assert json.loads((out / "SM8650" / "mlp_fp16" / "mlp_fp16_verify.json").read_text())["passed"]


def test_no_verify_plans_no_verification(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    assert ctxbuild("build", str(tree), "-o", str(out), "--no-verify").code == 0
    assert not [i for i in records(out) if i.startswith("verify/")]


@pytest.mark.parametrize("ref, got, cos, snr", [
    (np.zeros(8), np.zeros(8), 1.0, SNR_CAP_DB),        # both silent: a match, not NaN
    (np.zeros(8), np.ones(8), 0.0, -SNR_CAP_DB),        # noise where there is no signal: a failure
    (np.ones(8), np.zeros(8), 0.0, 0.0),                 # all-zero result against a signal: a failure
    (np.ones(8), np.ones(8), 1.0, SNR_CAP_DB),          # exact
])
def test_metrics_are_defined_near_zero(ref: np.ndarray, got: np.ndarray, cos: float, snr: float) -> None:
    m = metrics(ref, got)
    assert m["cosine"] == cos and m["snr_db"] == snr
    assert not any(isinstance(v, float) and np.isnan(v) for v in m.values())


def test_argmax_agreement_for_classifier_outputs() -> None:
    ref = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    got = np.array([[0.2, 0.8], [0.4, 0.6], [0.6, 0.4]])
    assert metrics(ref, got)["argmax_agreement"] == pytest.approx(1 / 3)


def test_coverage_counts_cpu_fallback_nodes(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """With cpu_fallback allowed, a node QNN rejects (Det) stays on the CPU and coverage says so."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    keep_only(tree)
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "W")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"), helper.make_node("Relu", ["m"], ["r"], name="relu"),
         helper.make_node("Det", ["r"], ["d"], name="det0"), helper.make_node("Mul", ["d", "d"], ["y"], name="sq")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
              tree / "models" / "det.onnx")
    (tree / "det.yaml").write_text("model: models/det.onnx\nprecision: fp16\ntargets: [SM8650]\n"
                                   "compile: {cpu_fallback: true}\nverify: {min_cosine: 0.9, min_snr_db: 10}\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    res = records(out)["verify/det@SM8650"]["result"]
    # Det on the CPU cuts the graph in two; it holds none of the MatMul's MACs
    assert res["coverage"] == {"qnn_nodes": 3, "cpu_nodes": 1, "fraction": 0.75, "partitions": 2, "cpu_macs_share": 0.0,
                               "cpu_macs": 0, "total_macs": 2 * 4 * 4 * 4, "cpu_ops": {"Det": 1}}
    manifest = json.loads((out / "manifest.json").read_text())
    ctx = next(a for a in manifest["artifacts"] if a["path"] == "SM8650/det/det_ctx.onnx")
    assert isinstance(ctx["graph_name_in_binary"], list) and len(ctx["graph_name_in_binary"]) == 2
    (row,) = [r for r in json.loads((out / "report.json").read_text())["rows"] if r["recipe"] == "det"]
    assert row["coverage"]["partitions"] == 2 and row["coverage"]["cpu_macs_share"] == 0.0
    assert "2 NPU partitions, 0.0% of MACs on the CPU" in (out / "report.html").read_text()


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()) if d.is_dir() else []


def test_what_ships_passed(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """With -k 1 the first failed verification stops the build: the other SoC's binary was compiled but never
    verified, so it must not stay deliverable either (it stayed in OUT/SM8750/, and `check` said it loads). Once
    the recipe passes, both SoCs ship and the set-aside copies go."""
    keep_only(tree)
    recipe = (TINY_CNN + "precision: w8a8\n"
              "calibration: {dir: models/calib/tiny_cnn}\ntargets: [SM8650, SM8750]\n")
    (tree / "strict.yaml").write_text(recipe + "verify: {min_snr_db: 119}\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "-k", "1", "-j", "1")
    assert r.code == 1, r.text
    assert _files(out / "SM8650") == [] and _files(out / "SM8750") == [], (_files(out / "SM8650"), _files(out / "SM8750"))
    aside = _files(out / ".ctxbuild" / "failed")
    assert "SM8650/strict/strict_ctx.onnx" in aside and "SM8750/strict/strict_ctx.onnx" in aside, aside
    manifest = json.loads((out / "manifest.json").read_text())
    assert not [a for a in manifest["artifacts"] if a["recipe"] == "strict"], manifest["artifacts"]

    (tree / "strict.yaml").write_text(recipe)
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    for soc in ("SM8650", "SM8750"):
        assert "strict/strict_ctx.onnx" in _files(out / soc)
    assert _files(out / ".ctxbuild" / "failed") == []
