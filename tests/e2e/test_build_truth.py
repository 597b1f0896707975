"""Issue 48, a build that tells the truth at a glance: `--target` limits every row; ninja's own lines never reach
the user; a CPU-fallback build's verdict says what ran on the CPU as a share of the compute; samples of another
dtype are said; every "will not load" of `check` ends with its fix. (Progress and counts of a precision search:
tests/e2e/test_search_progress.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

from tests._qnn_models import IR_VERSION
from tests.conftest import keep_only


def test_target_limits_every_row_and_ninja_says_nothing(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """`--target SM8650` on a recipe for SM8650 and SM8750: no SM8750 row ("not run (the build stopped first)"
    before) in the summary, --json or the report; the no-op after it says `ctxbuild: up to date`, not ninja's
    `ninja: no work to do.` (on stderr under --json before)."""
    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650")
    assert r.code == 0, r.text
    rows = [line.split() for line in r.out.splitlines() if line.startswith("  mlp_fp16")]
    assert [row[2] for row in rows] == ["SM8650"], r.out
    report = json.loads((out / "report.json").read_text())
    assert [row["target"]["name"] for row in report["rows"]] == ["SM8650"]
    assert report["build"]["selection"] == {"recipes": [], "targets": ["SM8650"]}
    assert "SM8750" not in (out / "report.html").read_text()
    r = ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650", "--json")
    assert r.code == 0 and r.err == "", r.text
    doc = json.loads(r.out)
    assert doc["up_to_date"] and [a["target"] for a in doc["accuracy"]] == ["SM8650"]
    r = ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650")
    assert r.code == 0 and "ninja" not in r.text and r.out.startswith("ctxbuild: up to date\n"), r.text
    r = ctxbuild("build", str(tree), "-o", str(out))  # all targets again: both rows
    assert r.code == 0 and [row["target"]["name"] for row in json.loads((out / "report.json").read_text())["rows"]] \
        == ["SM8650", "SM8750"], r.text


def test_a_stopped_build_shows_ctxbuilds_line_not_ninjas(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """A compile QNN refuses under `-k 0`: its verify cannot run, and ninja's `ninja: build stopped: cannot make
    progress due to previous errors.` came above ctxbuild's FAILED line."""
    keep_only(tree)
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"), helper.make_node("Det", ["m"], ["y"], name="det0")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION),
         tree / "models" / "det.onnx")
    (tree / "det.yaml").write_text("model: models/det.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "-k", "0")
    assert r.code == 1, r.text
    assert "ctxbuild: FAILED compile/det@SM8650: " in r.err, r.text
    assert not [line for line in r.text.splitlines() if line.startswith("ninja")], r.text


def test_cpu_fallback_verdict_says_the_cpus_share_of_the_compute(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """An LSTM QNN refuses (its `clip` attribute) runs on the CPU under compile.cpu_fallback: nearly all the MACs.
    The verdict said a plain "ok" and verify.json `cpu_macs_share: null` (the int16 Q/DQ before the LSTM hid its
    shapes from the count)."""
    keep_only(tree)
    rng = np.random.default_rng(0)
    steps, hidden, size = 20, 32, 16
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n) for n, s in
             (("W", (1, 4 * hidden, size)), ("R", (1, 4 * hidden, hidden)), ("Wo", (hidden, 8)))]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axis"))
    g = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R"], ["Y", "Yh"], name="lstm", hidden_size=hidden, clip=3.0),
         helper.make_node("Squeeze", ["Yh", "axis"], ["h"], name="squeeze"),
         helper.make_node("MatMul", ["h", "Wo"], ["y"], name="proj")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION),
         tree / "models" / "lstm.onnx")
    (tree / "models" / "calib_lstm").mkdir()
    for i in range(4):
        np.save(tree / "models" / "calib_lstm" / f"{i}.npy", rng.standard_normal((steps, 1, size)).astype(np.float32))
    (tree / "lstm.yaml").write_text("model: models/lstm.onnx\nprecision: w8a16\ncalibration: {dir: models/calib_lstm}\n"
                                    "targets: [SM8650]\ncompile: {cpu_fallback: true}\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    lstm_macs = steps * (4 * hidden * size + 4 * hidden * hidden)
    share = lstm_macs / (lstm_macs + hidden * 8)
    (row,) = [line for line in r.out.splitlines() if line.startswith("  lstm ")]
    assert row.endswith(f"ok; on the CPU: {100 * share:.1f}% of the MACs (1 LSTM, 2 other nodes)"), r.out
    coverage = json.loads((out / "SM8650" / "lstm" / "lstm_verify.json").read_text())["coverage"]
    assert coverage["cpu_macs_share"] == round(share, 4) and coverage["total_macs"] == lstm_macs + hidden * 8
    doc = json.loads(ctxbuild("build", str(tree), "-o", str(out), "--json").out)
    assert doc["accuracy"][0]["on_cpu"]["ops"]["LSTM"] == 1
    assert "on the CPU: 1 DequantizeLinear, 1 LSTM, 1 QuantizeLinear" in (out / "report.html").read_text()


def test_samples_of_another_dtype_warn_or_fail_in_one_line(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """float32 samples for a bool input were cast silently: 0/1 is a warning naming the input, 0.5 (which the cast
    makes True) an error, exit 2, in one line naming the file and the input."""
    keep_only(tree)
    g = helper.make_graph(
        [helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.FLOAT, name="cast"),
         helper.make_node("Mul", ["x", "keep"], ["y"], name="mul")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
              helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION),
         tree / "models" / "masked.onnx")
    samples = tree / "models" / "masked_samples"
    samples.mkdir()
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    for i in range(2):
        np.savez(samples / f"{i}.npz", x=x, mask=np.array([[1, 0, 1, 1]], np.float32))
    (tree / "masked.yaml").write_text("model: models/masked.onnx\nprecision: fp16\nverify: {dir: models/masked_samples}\n"
                                      "targets: [SM8650]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert "ctxbuild: warning: verify masked@SM8650: sample 0.npz holds mask as float32, the model takes bool: cast " \
           "to bool (every value kept); save the samples as bool" in r.text, r.text
    np.savez(samples / "1.npz", x=x, mask=np.array([[0.5, 0, 1, 1]], np.float32))
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 2, r.text
    (failed,) = [line for line in r.err.splitlines() if line.startswith("ctxbuild: FAILED")]
    assert f"{samples / '1.npz'}: 'mask' is float32, the model takes bool, and the cast changes values (0.5 becomes " \
           "True, 1 of 4)" in failed, r.text


def test_every_will_not_load_in_check_ends_with_its_fix(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """`ctxbuild check` said "will not load" and never what to do (issue 48)."""
    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    assert ctxbuild("build", str(tree), "-o", str(out)).code == 0
    r = ctxbuild("check", str(out), "--runtime", "qairt=2.47", "--no-ep")
    assert r.code == 1, r.text
    refused = [line for line in r.out.splitlines() if " will not load " in line]
    assert len(refused) == 2, r.out  # SM8650 and SM8750, both compiled by QAIRT 2.51
    for line in refused:
        assert line.endswith('; fix: build for that runtime too: `toolchain: [installed, {qairt: "2.47"}]` in the '
                             "recipe"), line
    rows = json.loads(ctxbuild("check", str(out), "--runtime", "onnxruntime-qnn=2.3.0", "--no-ep", "--json").out)
    assert {r["fix"] for r in rows} == {'build for that runtime too: `toolchain: [installed, "2.3.0"]` in the recipe'}
    # the SM8750 build (HTP v79) on an SM8650 (v75): the same recipe's SM8650 build loads there
    r = ctxbuild("check", str(out), "--runtime", "qairt=2.51", "--soc", "SM8650", "--no-ep")
    (line,) = [line for line in r.out.splitlines() if " will not load " in line]
    assert line.startswith("SM8750/mlp_fp16/mlp_fp16_ctx.onnx") and line.endswith(
        "built for HTP v79, the SoC has v75; fix: ship SM8650/mlp_fp16/mlp_fp16_ctx.onnx to these devices: it loads")
    r = ctxbuild("check", str(out / "SM8750" / "mlp_fp16" / "mlp_fp16_ctx.onnx"), "--runtime", "qairt=2.51", "--soc",
                 "SM8650", "--no-ep")
    assert r.code == 1 and "fix: build for that SoC too: add SM8650 to the recipe's `targets:`" in r.out, r.text


def test_the_cpu_note_says_unknown_macs() -> None:
    """A node whose MACs cannot be counted is named in the verdict, with where it ran, never counted as 0."""
    from ctxbuild.outputs.summary import cpu_note, on_cpu

    coverage = {"qnn_nodes": 10, "cpu_nodes": 3, "cpu_macs_share": 0.25, "cpu_ops": {"LSTM": 1, "Mul": 2},
                "macs_unknown": [{"node": "attn", "op": "SparseAttention", "on": "NPU"}]}
    assert cpu_note(on_cpu(coverage)) == ("; on the CPU: 25.0% of the counted MACs (1 LSTM, 2 other nodes); MACs "
                                          "unknown: attn (SparseAttention, NPU)")
    coverage |= {"cpu_macs_share": None, "macs_unknown": [{"node": "lstm", "op": "LSTM", "on": "CPU"}]}
    assert cpu_note(on_cpu(coverage)) == "; on the CPU: share of MACs unknown (1 LSTM, 2 other nodes); MACs unknown: " \
                                         "lstm (LSTM, CPU)"
    assert on_cpu({"qnn_nodes": 4, "cpu_nodes": 0, "fraction": 1.0}) is None and cpu_note(None) == ""
