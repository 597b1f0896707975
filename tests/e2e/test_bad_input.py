"""Every bad input gets one clear line (file, field or node, what to do), the right exit code, and loses nothing."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import TINY_CNN, write_recipe, last_build


def _save(model: onnx.ModelProto, path: Path, ir: int = 10) -> Path:
    model.ir_version = ir
    onnx.save(model, path)
    return path


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name: str, shape: list, t: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, shape)


def _only(tree: Path, keep: str) -> None:
    """Leave only one recipe in the tree, so a failure is that recipe's alone."""
    for p in tree.glob("*.yaml"):
        if p.name not in (keep, "_defaults.yaml"):
            p.unlink()


def _build(ctxbuild, tree: Path, tmp_path: Path, *extra: str):
    return ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), *extra)


FP16 = "precision: fp16\ntargets: [SM8650]\n"


# ---- recipe errors: exit 2, file:line, a hint ------------------------------------------------------------

@pytest.mark.parametrize("body, expect", [
    ("model: models/mlp.onnx\nprecison: fp16\ntargets: [SM8650]\n", ["unknown key 'precison'", "did you mean 'precision'"]),
    ("model: models/mlp.onnx\nprecision: fp16\ntargets: [SM8651]\n", [":3:", "unknown SoC or target group 'SM8651'", "did you mean"]),
    ("model: models/mlp.onnx\nprecision: fp16\ntargets: [SM8650]\ncompile:\n  optimization_mode: fast\n", [":5:", "compile.optimization_mode"]),
    ("model: models/mlp.onnx\nprecision: fp32\ntargets: [SM8650]\n", [":2:", "'fp32' is not one of"]),
    ("- model: models/mlp.onnx\n", [":1:", "must be a YAML mapping"]),
    ("model: [unclosed\n", ["invalid YAML"]),
    ("model: models/mlp.onnx\nmodel: models/tiny_cnn.onnx\n" + FP16, ["bad.yaml:2: duplicate key 'model'"]),
    ("model: models/nope.onnx\n" + FP16, [":1:", "model 'models/nope.onnx' not found"]),
    ("name: ../escape\nmodel: models/mlp.onnx\n" + FP16, [":1:", "not a valid name"]),
    ("model: models/tiny_cnn.onnx\nprecision: w8a16\ntargets: [SM8650]\n", ["needs calibration data", "calibration.random"]),
    ("model: models/tiny_cnn.onnx\nprecision: w8a16\ntargets: [SM8650]\ncalibration:\n  dir: nowhere\n", [":5:", "calibration dir 'nowhere' not found"]),
    # bounds: a value no build means is refused at plan time, NaN and infinities included
    ("model: models/mlp.onnx\n" + FP16 + "verify: {min_cosine: .nan}\n", [":4:", ".nan is not a finite number"]),
    ("model: models/mlp.onnx\n" + FP16 + "verify: {min_snr_db: -.inf}\n", [":4:", "-.inf is not a finite number"]),
    ("model: models/mlp.onnx\n" + FP16 + "verify: {min_snr_db: 1.0e30}\n", [":4:", "verify.min_snr_db"]),
    ("model: models/mlp.onnx\nprecision: fp16\ntargets: [{name: X, soc_model: 0, htp_arch: 75}]\n", [":3:", "soc_model"]),
    ("model: models/mlp.onnx\n" + FP16 + "inputs: {x: [1099511627776, 4]}\n", [":4:", "inputs"]),
])
def test_bad_recipe_exits_2_with_location(tree: Path, tmp_path: Path, ctxbuild, body: str, expect: list[str]) -> None:
    _only(tree, "bad.yaml")
    write_recipe(tree, "bad", body)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 2, r.text
    line = r.err.strip().splitlines()[-1]
    assert "bad.yaml" in line, line
    for e in expect:
        assert e in line, line


def test_duplicate_recipe_names(tree: Path, tmp_path: Path, ctxbuild) -> None:
    (tree / "sub").mkdir()
    write_recipe(tree / "sub", "tiny_cnn", "model: ../models/mlp.onnx\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 2
    assert "recipe name 'tiny_cnn' is already used by" in r.err and "unique" in r.err


def test_usage_error_exits_2(ctxbuild, tree: Path, tmp_path: Path) -> None:
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "--target", "SM9999")
    assert r.code == 2 and "--target SM9999" in r.err
    assert ctxbuild("build", "--bogus").code == 2
    assert ctxbuild("build", str(tmp_path / "missing")).code == 2


# ---- model errors: the build fails (exit 1), names the model and node, leaves no output -----------------

def test_missing_and_corrupt_onnx(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "bad.yaml")
    (tree / "models" / "corrupt.onnx").write_bytes(b"\x08\x07garbage" * 50)
    write_recipe(tree, "bad", "model: models/corrupt.onnx\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1, r.text
    assert "corrupt.onnx: not a valid ONNX model" in r.err
    (tree / "models" / "truncated.onnx").write_bytes((tree / "models" / "mlp.onnx").read_bytes()[:5000])
    write_recipe(tree, "bad", "model: models/truncated.onnx\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1 and "truncated.onnx: not a valid ONNX model" in r.err, r.text


def test_cpu_fallback_when_qnn_takes_no_node(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """Following the hint (compile.cpu_fallback) on a model of which QNN takes nothing: one line saying so (it
    ended in "[Errno 2] No such file ... _ctx_qnn.bin")."""
    _only(tree, "bad.yaml")
    m = _model([helper.make_node("NonZero", ["x"], ["y"], name="find_nonzero")], [_vi("x", [1, 8])],
               [_vi("y", None, TensorProto.INT64)])
    _save(m, tree / "models" / "nz_only.onnx")
    write_recipe(tree, "bad", "model: models/nz_only.onnx\n" + FP16 + "compile: {cpu_fallback: true}\n")
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1 and "QNN took none of the model's nodes" in r.err and "Errno" not in r.err, r.text


def test_unsupported_ops_name_the_nodes(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "bad.yaml")
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="relu0"),
                helper.make_node("NonZero", ["r"], ["y"], name="find_nonzero")],
               [_vi("x", [1, 8])], [_vi("y", None, TensorProto.INT64)])
    _save(m, tree / "models" / "nz.onnx")
    write_recipe(tree, "bad", "model: models/nz.onnx\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1
    assert "QNN cannot run 1 node(s): find_nonzero (NonZero)" in r.err
    assert "cpu_fallback: true" in r.err
    assert not list((tmp_path / "out").glob("SM8650/bad/*"))


def test_control_flow_rejected(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "bad.yaml")
    branch = lambda v: helper.make_graph(  # noqa: E731
        [helper.make_node("Constant", [], ["o"], value=helper.make_tensor("c", TensorProto.FLOAT, [1], [v]))],
        "b", [], [_vi("o", [1])])
    m = _model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                helper.make_node("Cast", ["s"], ["c"], to=TensorProto.BOOL),
                helper.make_node("If", ["c"], ["y"], name="branchy", then_branch=branch(1.0), else_branch=branch(0.0))],
               [_vi("x", [1, 4])], [_vi("y", [1])])
    _save(m, tree / "models" / "if.onnx")
    write_recipe(tree, "bad", "model: models/if.onnx\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1
    assert "control flow is not supported on QNN: node 'branchy' (If)" in r.err
    assert "`outputs: [c]` in the recipe (the rest, from If 'branchy' on, runs in the app)" in r.err, r.err


def test_dynamic_dim_must_be_fixed(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "bad.yaml")
    write_recipe(tree, "bad", "model: models/tiny_cnn.onnx\nprecision: w8a16\ncalibration: {random: true}\ntargets: [SM8650]\n")
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 2  # known when planning: a recipe error with the recipe's file:line
    assert f"{tree / 'bad.yaml'}:1: input 'image' of tiny_cnn.onnx has dynamic dims [N, 3, 64, 64]" in r.err
    assert "inputs: {image: [1, 3, 64, 64]}" in r.err and len(r.err.splitlines()) == 1


def test_wrong_input_name_and_rank(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "bad.yaml")
    write_recipe(tree, "bad", "model: models/mlp.onnx\ninputs: {tokens: [1, 16, 64]}\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 2 and f"{tree / 'bad.yaml'}:2: inputs: 'tokens' is not an input of mlp.onnx" in r.err
    assert "its inputs are: x [1, 16, 64]" in r.err
    write_recipe(tree, "bad", "model: models/mlp.onnx\ninputs: {x: [16, 64]}\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 2 and "inputs: 'x' is [16, 64] in the recipe and [1, 16, 64] in mlp.onnx (rank 2, the model's is 3)" in r.err
    assert not (tmp_path / "out").exists()  # stopped before anything was planned or built


def test_ir_version_too_new(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "bad.yaml")
    m = onnx.load(tree / "models" / "mlp.onnx")
    _save(m, tree / "models" / "future.onnx", ir=onnx.IR_VERSION + 5)
    write_recipe(tree, "bad", "model: models/future.onnx\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1
    assert f"IR version {onnx.IR_VERSION + 5} is newer than this toolchain reads" in r.err


def test_ir_version_14_is_stamped_down_and_builds(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads <= 13. prepare stamps it down."""
    _only(tree, "ok.yaml")
    _save(onnx.load(tree / "models" / "mlp.onnx"), tree / "models" / "ir14.onnx", ir=14)
    write_recipe(tree, "ok", "model: models/ir14.onnx\n" + FP16)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 0, r.text


def test_calibration_names_and_shapes_checked(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "bad.yaml")
    cal = tree / "badcal"
    cal.mkdir()
    np.savez(cal / "s0.npz", img=np.zeros((1, 3, 64, 64), np.float32))
    body = (TINY_CNN + "precision: w8a16\n"
            "calibration: {dir: badcal}\ntargets: [SM8650]\n")
    write_recipe(tree, "bad", body)
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1
    assert "s0.npz: sample keys ['img'] do not match the model inputs ['image']" in r.err
    (cal / "s0.npz").unlink()
    np.savez(cal / "s1.npz", image=np.zeros((1, 3, 32, 32), np.float32))
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1
    assert "s1.npz: 'image' has shape [1, 3, 32, 32], the recipe fixes it to [1, 3, 64, 64]" in r.err


def test_random_calibration_warns(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "rnd.yaml")
    write_recipe(tree, "rnd", TINY_CNN + "precision: w8a8\n"
                         "calibration: {random: true, samples: 2}\ntargets: [SM8650]\n")
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 0, r.text
    assert "warning: quantize tiny_cnn (w8a8): calibrating on random data" in r.text


def test_failed_action_removes_stale_output(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """A recipe that built once and then breaks must not leave the old binary to be shipped."""
    _only(tree, "mlp_fp16.yaml")
    (tree / "mlp_fp16.yaml").write_text((tree / "mlp_fp16.yaml").read_text() + "inputs: {x: [1, 16, 64]}\n")
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 0, r.text
    out = tmp_path / "out"
    assert (out / "SM8650" / "mlp_fp16" / "mlp_fp16_ctx.onnx").is_file()
    # the model changes under the same recipe (no re-plan: models are not what build.ninja is made of) into one
    # whose input differs: prepare fails. (A recipe that contradicts the model fails when planning: exit 2.)
    m = onnx.load(tree / "models" / "mlp.onnx")
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 8
    _save(m, tree / "models" / "mlp.onnx")
    r = _build(ctxbuild, tree, tmp_path)
    assert r.code == 1
    assert "FAILED prepare/" in r.err and "'x' dim 1 is fixed to 8" in r.err
    assert not (out / "SM8650" / "mlp_fp16" / "mlp_fp16_ctx.onnx").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert not [a for a in manifest["artifacts"] if a["recipe"] == "mlp_fp16"]
    assert last_build(out)


def test_malformed_remote_cache_url_is_a_usage_error(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, "mlp_fp16.yaml")
    r = _build(ctxbuild, tree, tmp_path, "--remote-cache", "ftp://cache.example/x")
    assert r.code == 2 and "remote cache URL 'ftp://cache.example/x' is not http(s)://host[:port][/path]" in r.err
    assert not (tmp_path / "out" / "SM8650").exists()


def test_a_garbage_prebuilt_is_named_as_given(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """The error names the user's file, not the staged copy under OUT/.ctxbuild/tmp that was read."""
    _only(tree, "junk.yaml")
    (tree / "junk.bin").write_bytes(bytes(range(256)) * 20)
    write_recipe(tree, "junk", "prebuilt: {bin: junk.bin}\ntargets: [SM8650]\n")
    r = _build(ctxbuild, tree, tmp_path)
    line = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED prebuilt/junk@SM8650"))
    assert r.code == 1 and f"{tree / 'junk.bin'}: not a readable QNN context binary" in line, line
    assert ".ctxbuild/tmp" not in line.split("(log:")[0], line
