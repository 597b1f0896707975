"""The fp16-only legalization rules (graph/legalize FP16_RULES), which compile applies to fp16 builds: sigmoid_exp."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.graph.legalize import legalize_fp16


def _head() -> onnx.ModelProto:
    """A detector's class head in small: Conv -> SiLU (Sigmoid, Mul) -> 1x1 Conv with a -7 bias -> Sigmoid, so the
    scores sit near 1e-3 as a detector's do on an image with nothing to find."""
    rng = np.random.default_rng(18)
    inits = {"w1": (rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32),
             "w2": (rng.standard_normal((6, 16, 1, 1)) / 4).astype(np.float32), "b2": np.full(6, -7.0, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="stem"),
             helper.make_node("Sigmoid", ["c1"], ["s1"], name="act_sigmoid"),
             helper.make_node("Mul", ["c1", "s1"], ["a1"], name="act_mul"),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["logits"], name="cls"),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="score")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 24, 24])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 6, 24, 24])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _samples(d: Path) -> None:
    rng = np.random.default_rng(3)
    d.mkdir(parents=True)
    for i in range(2):
        np.savez(d / f"s{i}.npz", x=rng.normal(0, 2, (1, 8, 24, 24)).astype(np.float32))


def test_sigmoid_exp_computes_the_same_under_the_users_names() -> None:
    """SiLU becomes x / (1 + Exp(-x)) under the Mul's name, the last Sigmoid 1 / (1 + Exp(-x)) under its own name
    and output; the same values on the CPU EP."""
    m = _head()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(m)
    assert legalize_fp16(rewritten, ["sigmoid_exp"]) == {"sigmoid_exp": 2}
    onnx.checker.check_model(rewritten, full_check=True)
    ops = {n.name: n.op_type for n in rewritten.graph.node}
    assert "Sigmoid" not in ops.values() and "act_sigmoid" not in ops
    assert (ops["act_mul"], ops["score"], ops["stem"], ops["cls"]) == ("Div", "Reciprocal", "Conv", "Conv")
    x = np.random.default_rng(5).normal(0, 3, (1, 8, 24, 24)).astype(np.float32)
    (a,), (b,) = (ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
                  for p in (m, rewritten))
    assert np.abs(a - b).max() <= 1e-6 * np.abs(a).max()
    assert legalize_fp16(m, []) == {}  # none named (prepare.rewrite leaves it out): nothing changes


def test_fp16_build_with_sigmoid_scores_passes(tmp_path: Path, ctxbuild) -> None:
    """At fp16 the HTP's Sigmoid has an absolute error floor: scores near 1e-3 verified at cosine 0.949 / 10 dB
    (prepare: {rewrite: false} keeps it that way); the compile's rewrite passes the default thresholds (measured
    1.0000 / 50.1 dB)."""
    onnx.save(_head(), tmp_path / "head.onnx")
    _samples(tmp_path / "cal")
    for name, extra in (("head", ""), ("head_as_written", "prepare: {rewrite: false}\n")):
        (tmp_path / f"{name}.yaml").write_text(f"model: head.onnx\nprecision: fp16\n{extra}calibration: {{dir: cal}}\n"
                                              "targets: [SM8650]\n")
    r = ctxbuild("build", str(tmp_path), "-o", str(tmp_path / "out"), "-k", "0")
    assert r.code == 1, r.text
    assert "FAILED verify/head_as_written@SM8650" in r.err and "FAILED verify/head@SM8650" not in r.err, r.err
    assert (tmp_path / "out" / "SM8650" / "head" / "head_ctx_qnn.bin").is_file()


def test_fp16_compiles_are_rewritten_except_a_bundles(tmp_path: Path) -> None:
    """Plan: a single-graph fp16 compile carries the rules (and their code's digest, so a changed rule recompiles);
    an int16 one does not, nor does prepare.rewrite: false; a bundle's verification twins do not, since the bundle
    compiles the prepared models as they are and the twins must compile what it ships."""
    from ctxbuild.plan.planner import make_plan
    from ctxbuild.recipes import recipe
    from tests.fake_tree import fake_tree

    tree = fake_tree(tmp_path / "recipes")
    (tree / "lm_bundle.yaml").write_text((tree / "lm_bundle.yaml").read_text().replace("precision: w8a16",
                                                                                       "precision: fp16"))
    (tree / "mlp_written.yaml").write_text((tree / "mlp_fp16.yaml").read_text() + "prepare: {rewrite: false}\n")
    compiles = {a.id: a.params for a in make_plan(recipe.load([tree]), tmp_path / "out").actions
                if a.kind == "compile"}
    rewritten = {i.split("/")[1].split("@")[0] for i, p in compiles.items() if "fp16_rewrite" in p}
    assert rewritten == {"mlp_fp16"}, sorted(compiles)
    assert any(i.startswith("compile/lm_bundle.") for i in compiles)  # the twins, planned without it
    assert compiles["compile/mlp_fp16@SM8650"]["fp16_rewrite"]["rules"] == ["sigmoid_exp", "hardswish_order",
                                                                           "conv_gelu_clip"]
