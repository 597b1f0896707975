"""Recipe quantization options: each one builds on the simulator and shows its effect in the QDQ model;
combinations the HTP cannot run are refused with the recipe's file:line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.conftest import TINY_CNN, records

HEAD = TINY_CNN + "calibration: {dir: models/calib/tiny_cnn}\n"


def _only(tree: Path, recipes: dict[str, str]) -> None:
    for p in tree.glob("*.yaml"):
        if p.name != "_defaults.yaml":
            p.unlink()
    for name, body in recipes.items():
        (tree / f"{name}.yaml").write_text(HEAD + body)


def _qdq(out: Path, recipe: str, target: str = "SM8650") -> onnx.ModelProto:
    """The quantized model the recipe's compile read (plan.json: the compile's quantize dependency)."""
    plan = json.loads((out / ".ctxbuild" / "plan.json").read_text())
    by_id = {a["id"]: a for a in plan["actions"]}
    q = next(d for d in by_id[f"compile/{recipe}@{target}"]["deps"] if d.startswith("quantize/"))
    return onnx.load(by_id[q]["outputs"][0])


def _inits(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}


def _dq_of(m: onnx.ModelProto, quantized: str) -> onnx.NodeProto:
    return next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == quantized)


def _q_params(m: onnx.ModelProto, tensor: str) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point of the QuantizeLinear that quantizes activation `tensor`."""
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    inits = _inits(m)
    return inits[q.input[1]], inits[q.input[2]]


RECIPES = {
    "base": "precision: w8a16\ntargets: [SM8650]\n",
    "pc": "precision: w8a16\nquantization: {per_channel: true}\ntargets: [SM8650]\n",
    "w16": "precision: w8a16\nquantization: {weights: int16}\ntargets: [SM8650, SM8750]\n",
    "w8a8": "precision: w8a16\nquantization: {activations: uint8, weights: uint8}\ntargets: [SM8650]\n",
    "asym": "precision: w8a16\nquantization: {activation_symmetric: true}\ntargets: [SM8650]\n",
    "wsym": "precision: w8a16\nquantization: {weight_symmetric: true}\ntargets: [SM8650]\n",
    "pct": "precision: w8a16\nquantization: {calibration_method: percentile, percentile: 99.0}\ntargets: [SM8650]\n",
    "few": "precision: w8a16\nquantization: {samples: 2}\ntargets: [SM8650]\n",
    "ovr": ("precision: w8a16\nquantization:\n  tensors: {r1: {rmin: 0.0, rmax: 8.0}}\n"
            "  nodes: {conv2: {weights: int16}}\ntargets: [SM8650]\n"),
    "tsym": "precision: w8a16\nquantization:\n  tensors: {wf: {symmetric: true}}\ntargets: [SM8650]\n",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    import os
    import shutil
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("quant")
    tree = root / "recipes"
    shutil.copytree(example_models, tree / "models")
    (tree / "_defaults.yaml").write_text("defaults: {compile: {optimization_mode: 3}}\n")
    _only(tree, RECIPES)
    out = root / "out"
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(root / "cache")}
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(tree), "-o", str(out)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    return out


def test_every_option_builds_and_verifies_on_the_simulator(built: Path) -> None:
    recs = records(built)
    for name in RECIPES:
        targets = ["SM8650", "SM8750"] if name == "w16" else ["SM8650"]
        for t in targets:
            assert recs[f"verify/{name}@{t}"]["result"]["passed"], name
            assert (built / t / name / f"{name}_ctx_qnn.bin").stat().st_size > 0


def test_per_channel_weights_have_a_scale_per_output_channel(built: Path) -> None:
    m, base = _qdq(built, "pc"), _qdq(built, "base")
    w2 = _dq_of(m, "w2_quantized")
    scale = _inits(m)[w2.input[1]]
    assert scale.shape == (32,) and len(set(scale.tolist())) > 1
    assert next(a.i for a in w2.attribute if a.name == "axis") == 0
    assert _inits(base)[_dq_of(base, "w2_quantized").input[1]].shape == ()


def test_int16_weights(built: Path) -> None:
    w = _inits(_qdq(built, "w16"))
    assert w["w2_quantized"].dtype == np.int16 and w["wf_quantized"].dtype == np.int16
    assert _inits(_qdq(built, "base"))["w2_quantized"].dtype == np.uint8


def test_w8a8_activations_are_uint8(built: Path) -> None:
    _, zp = _q_params(_qdq(built, "w8a8"), "image")
    assert zp.dtype == np.uint8
    assert _q_params(_qdq(built, "base"), "image")[1].dtype == np.uint16


def test_symmetric_activations_center_the_zero_point(built: Path) -> None:
    _, zp = _q_params(_qdq(built, "asym"), "image")
    assert int(zp) == 32768
    assert int(_q_params(_qdq(built, "base"), "image")[1]) != 32768


def test_symmetric_weights_center_the_zero_point(built: Path) -> None:
    def zp(recipe: str, weight: str) -> int:
        m = _qdq(built, recipe)
        return int(_inits(m)[_dq_of(m, f"{weight}_quantized").input[2]])

    assert zp("wsym", "w2") == 128 and zp("wsym", "wf") == 128  # every uint8 weight, symmetric
    assert zp("tsym", "wf") == 128 and zp("tsym", "w2") != 128  # one tensor, by a tensor override
    assert zp("base", "wf") != 128


def test_calibration_method_changes_ranges(built: Path) -> None:
    base = float(_q_params(_qdq(built, "base"), "r1")[0])
    pct = float(_q_params(_qdq(built, "pct"), "r1")[0])
    assert pct < base  # the 99th percentile clips the largest activations min-max keeps


def test_samples_limit_the_calibration_inputs(built: Path) -> None:
    recs = records(built)
    quant = {i: r for i, r in recs.items() if i.startswith("quantize/")}
    counts = sorted(len(r["key_detail"]["discovered_inputs"]) for r in quant.values())
    assert counts[0] == 2 and counts[-1] == 8


def test_tensor_and_node_overrides(built: Path) -> None:
    m = _qdq(built, "ovr")
    scale, zp = _q_params(m, "r1")
    assert int(zp) == 0 and float(scale) == pytest.approx(8.0 / 65535, rel=1e-5)  # rmin 0, rmax 8 as asked
    w = _inits(m)
    assert w["w2_quantized"].dtype == np.int16  # conv2's weight, by the node override
    assert w["wf_quantized"].dtype == np.uint8  # the classifier keeps the recipe's default


def test_options_enter_the_action_key(built: Path) -> None:
    keys = {r["key"] for i, r in records(built).items() if i.startswith("quantize/")}
    assert len(keys) == len(RECIPES)  # every recipe quantizes differently, so no two share a key


# ---- refused at plan time, with file:line ---------------------------------------------------------------

@pytest.mark.parametrize("body, expect", [
    ("precision: w8a16\nquantization:\n  weights: int16\ntargets: [SM8350]\n",
     [":6:", "int16 weights need HTP v73 or newer", "SM8350 is v68"]),
    ("precision: w8a16\nquantization: {activations: uint8, weights: int16}\ntargets: [SM8650]\n",
     [":5:", "int16 weights need uint16 activations"]),
    ("precision: fp16\nquantization: {per_channel: true}\ntargets: [SM8650]\n",
     [":5:", "has no effect with precision fp16"]),
    ("precision: w8a16\nquantization:\n  - {per_channel: true}\ntargets: [SM8650]\n",
     [":5:", "a ladder for precision: auto"]),
    ("precision: w8a16\nquantization: {percentile: 99.9}\ntargets: [SM8650]\n",
     [":5:", "needs calibration_method: percentile"]),
    ("precision: w8a16\nquantization:\n  per_chanel: true\ntargets: [SM8650]\n",
     [":6:", "unknown key 'per_chanel'", "did you mean 'per_channel'"]),
    ("precision: w8a16\nquantization: {weights: int4}\ntargets: [SM8650]\n",
     [":5:", "quantization.weights", "'int4' is not one of"]),
    ("precision: w8a16\nquantization: {calibration_method: entropy}\ntargets: [SM8650]\n",
     [":5:", "'entropy' is not one of"]),
])
def test_invalid_quantization_is_refused(tree: Path, tmp_path: Path, ctxbuild, body: str, expect: list[str]) -> None:
    _only(tree, {"bad": body})
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2, r.text
    for e in expect:
        assert e in r.err, r.err
    assert not (tmp_path / "out" / "SM8650").exists()


def test_defaults_file_quantization_merges_with_the_recipe(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, {"merged": "precision: w8a16\nquantization: {calibration_method: percentile}\ntargets: [SM8650]\n"})
    (tree / "_defaults.yaml").write_text("defaults:\n  quantization: {per_channel: true, weights: int16}\n")
    r = ctxbuild("plan", str(tree), "--format", "json")
    assert r.code == 0, r.text
    plan = json.loads(r.out)
    q = next(a for a in plan["actions"] if a["kind"] == "quantize")
    s = q["params"]["quantization"]
    got = (s["per_channel"], s["weights"], s["calibration_method"], s["percentile"])
    assert got == (True, "int16", "percentile", 99.999)


def test_a_shared_bias_beside_a_tensor_named_like_its_copy(tmp_path: Path, ctxbuild) -> None:
    """onnxruntime's quantizer copies a bias two Convs share as <name>0, <name>1, ... counting initializer names
    only; a tensor already of that name (TensorFlow names a Conv's output <bias>2: basic-pitch) then reads the
    copy's DequantizeLinear, and the QDQ model broke ("Concat axis must be in [-rank, rank-1]" at compile; basic-
    pitch's integer candidates were skipped as the CPU EP refused their QDQ models). Each Conv gets its own bias."""
    from onnx import TensorProto, helper

    from tests._qnn_models import IR_VERSION, OPSET

    r = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w1", "b"], ["b0"], name="conv_a", pads=[1, 1]),
             helper.make_node("Neg", ["b0"], ["n"], name="neg"),
             helper.make_node("Conv", ["x", "w2", "b"], ["c"], name="conv_b", pads=[1, 1]),
             helper.make_node("Concat", ["n", "c"], ["y"], name="cat", axis=1)]
    inits = {"w1": r.standard_normal((4, 2, 3)), "w2": r.standard_normal((4, 2, 3)), "b": r.standard_normal(4)}
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION), tmp_path / "m.onnx")
    (tmp_path / "cal").mkdir()
    for k in range(4):
        np.save(tmp_path / "cal" / f"s{k}.npy", np.random.default_rng(k).standard_normal((1, 2, 16)).astype(np.float32))
    (tmp_path / "m.yaml").write_text("model: m.onnx\nprecision: w8a16\ntargets: [SM8650]\ncalibration: {dir: cal}\n")
    res = ctxbuild("build", str(tmp_path / "m.yaml"), "-o", str(tmp_path / "out"))
    assert res.code == 0, res.text
    result = json.loads((tmp_path / "out" / "SM8650" / "m" / "m_verify.json").read_text())
    assert result["passed"], result  # measured: 1.0000 / 43.4 dB
