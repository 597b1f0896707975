"""The QNN EP's op trace (qnn/optrace.py) in what ctxbuild tells the user: why QNN refused a node, which of the
user's nodes one QNN op computes. Real compiles with onnxruntime-qnn; small synthetic models."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _tree(tmp_path: Path, nodes: list, inits: dict[str, float], recipe: str) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in inits.items()])
    tree = tmp_path / "recipes"
    tree.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), tree / "m.onnx")
    (tree / "m.yaml").write_text("model: m.onnx\ntargets: [SM8650]\n" + recipe)
    return tree


def _refusal(r) -> str:
    return next(ln for ln in r.err.splitlines() if "QNN cannot run" in ln)


def test_a_refusal_says_the_eps_reason(tmp_path: Path, ctxbuild) -> None:
    """QNN refuses a C-style Mod (fmod=1): the line says why, which the EP's log does not."""
    tree = _tree(tmp_path, [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
                            helper.make_node("Mod", ["r", "three"], ["y"], name="wrap", fmod=1)],
                 {"three": 3.0}, "precision: fp16\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 1, r.text
    line = _refusal(r)
    assert "QNN cannot run 1 node(s): wrap (Mod): QNN Mod Op only support fmod == 0 for now" in line, line
    assert "cpu_fallback: true" in line, line


def test_a_graph_qnn_takes_no_node_of_is_named_by_the_trace(tmp_path: Path, ctxbuild) -> None:
    """QNN takes none of the nodes: its log names none (the compile fails with "assigned to the default CPU EP");
    the trace names the node and why."""
    tree = _tree(tmp_path, [helper.make_node("Mod", ["x", "three"], ["y"], name="wrap", fmod=1)],
                 {"three": 3.0}, "precision: fp16\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 1, r.text
    line = _refusal(r)
    assert "QNN cannot run 1 node(s): wrap (Mod): QNN Mod Op only support fmod == 0 for now" in line, line


def test_a_refused_qdq_unit_is_its_node(tmp_path: Path) -> None:
    """QNN refuses a quantized Erf's QDQ unit whole: the trace lists the unit's DequantizeLinear and QuantizeLinear
    with the Erf's reason; refused() keeps the Erf and sets them apart."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from ctxbuild.qnn import optrace
    from ctxbuild.toolchain.installed import compile_model

    tree = _tree(tmp_path, [helper.make_node("Mul", ["x", "two"], ["m"], name="scale"),
                            helper.make_node("Erf", ["m"], ["e"], name="erf0"),
                            helper.make_node("Mul", ["e", "two"], ["y"], name="rescale")], {"two": 2.0}, "")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"x": np.random.default_rng(i).normal(size=(1, 8)).astype(np.float32)} for i in range(4)])

        def get_next(self) -> dict | None:
            return next(self.it, None)

    qdq = tmp_path / "m.qdq.onnx"
    quantize(str(tree / "m.onnx"), str(qdq), get_qnn_qdq_config(str(tree / "m.onnx"), Reader(),
                                                               activation_type=QuantType.QUInt16,
                                                               weight_type=QuantType.QUInt8))
    with pytest.raises(Exception, match="default CPU EP"):
        compile_model(qdq, tmp_path / "m_ctx.onnx",
                      {"soc_model": "57", "htp_arch": "75", **optrace.provider_options(tmp_path / "trace")},
                      embed=False, cpu_fallback=False)
    why, unit = optrace.refused(tmp_path / "trace")
    assert why == {("erf0", "Erf"): None}, why
    assert unit == {("m_DequantizeLinear", "DequantizeLinear"), ("e_QuantizeLinear", "QuantizeLinear")}, unit


def test_the_diagnosis_names_the_nodes_one_qnn_op_computes(tmp_path: Path, ctxbuild) -> None:
    """fp16: QNN folds an attention-style scale into the Softmax after it (one QNN Softmax, ScaleSoftmaxFusion); the
    diagnosis says which of the user's nodes that op computes."""
    tree = _tree(tmp_path, [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
                            helper.make_node("Mul", ["r", "k"], ["s"], name="scale_logits"),
                            helper.make_node("Softmax", ["s"], ["y"], name="probs", axis=-1)],
                 {"k": 0.125}, "precision: fp16\n")
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "m", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    d = json.loads((out / "SM8650" / "m" / "m_layers.json").read_text())
    assert d["htp_fusions"] == [{"qnn_op": "Softmax", "fusion": "ScaleSoftmaxFusion",
                                 "nodes": ["scale_logits", "probs"]}], d["htp_fusions"]
    rows = {n["node"]: n for n in d["worst_htp"]}
    assert rows["probs"]["htp_fused"] == {"qnn_op": "Softmax", "with": ["scale_logits"]}, rows
    assert "fused on the HTP into one Softmax (ScaleSoftmaxFusion): scale_logits, probs" in r.out, r.out


def test_an_fp16_hardswish_written_x_times_hardsigmoid_verifies(tmp_path: Path, ctxbuild) -> None:
    """QNN 2.7.0 computes Mul(x, HardSigmoid(x)) (alpha 1/6) as x * HardSwish(x) at fp16 (3.4 dB on these samples,
    found through the diagnosis: its probe on the HardSigmoid's output undoes it); hardswish_order swaps the Mul's
    inputs, which computes the same bit for bit, and the build verifies."""
    from ctxbuild.graph.legalize import legalize_fp16

    nodes = [helper.make_node("Mul", ["x", "two"], ["m"], name="scale"),
             helper.make_node("HardSigmoid", ["m"], ["h"], name="gate", alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["m", "h"], ["y"], name="swish")]
    tree = _tree(tmp_path, nodes, {"two": 2.0}, "precision: fp16\n")
    model = onnx.load(tree / "m.onnx")
    assert legalize_fp16(model, ["hardswish_order"]) == {"hardswish_order": 1}
    assert [(n.name, list(n.input)) for n in model.graph.node][2] == ("swish", ["h", "m"])
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 0, r.text
    v = json.loads((tmp_path / "out" / "SM8650" / "m" / "m_verify.json").read_text())
    assert v["outputs"]["y"]["snr_db"] > 50, v["outputs"]
    (tree / "m.yaml").write_text("model: m.onnx\ntargets: [SM8650]\nprecision: fp16\nprepare: {rewrite: false}\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 1 and "SNR 3.4 dB" in r.err, r.text  # the EP's fusion, as written
    # the diagnosis' probe on 'h' undoes it: it says its figures describe another computation (it said "nothing
    # to fix: it meets the thresholds")
    r = ctxbuild("verify", "--layers", "m", str(tree), "-o", str(tmp_path / "out"))
    d = json.loads((tmp_path / "out" / "SM8650" / "m" / "m_layers.json").read_text())
    assert not d["meets"] and round(d["outputs"]["y"]["delivered"]["snr_db"], 1) == 3.4, d["outputs"]
    assert d["hint"].startswith("the delivered build fails ('y' SNR 3.4 dB delivered, "), d["hint"]


def test_an_fp16_conv_then_gelu_is_kept_apart() -> None:
    """conv_gelu_clip puts a Clip at fp16's bounds between a Conv and the Gelu reading it (QNN's fused Conv -> Gelu is
    coarse at fp16): the same values, the Gelu under its own name."""
    import onnxruntime as ort

    from ctxbuild.graph.legalize import legalize_fp16

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.44, (32, 16, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(-0.23, 0.55, 32).astype(np.float32), "b")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
                               helper.make_node("Gelu", ["c"], ["y"], name="act", domain="com.microsoft")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8, 8])], [w, b])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert legalize_fp16(rewritten, ["conv_gelu_clip"]) == {"conv_gelu_clip": 1}
    assert [(n.name, n.op_type) for n in rewritten.graph.node] == [("conv", "Conv"), ("act_apart", "Clip"),
                                                                   ("act", "Gelu")]
    x = rng.normal(0, 3, (1, 16, 8, 8)).astype(np.float32)
    (a,), (c,) = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
                  for m in (model, rewritten))
    assert np.array_equal(a, c)


@pytest.mark.slow
def test_ppocrv6_recognizer_passes_at_fp16(tmp_path: Path, ctxbuild) -> None:
    """PP-OCRv6's small recognizer (rapidocr 3.10.0; 13 Gelus, each after a Conv) at fp16 on rendered text lines:
    0.9933 / 18.7 dB before conv_gelu_clip, 0.9998 / 33.8 dB with it (SM8650 simulator, 4 samples, 63 s)."""
    from bench.real_models.inputs import write_samples
    from bench.real_models.models import MODELS, MissingModel, locate

    try:
        model, m = locate("ppocrv6_rec"), MODELS["ppocrv6_rec"]
    except MissingModel as e:
        pytest.skip(str(e))
    tree = tmp_path / "recipes"
    write_samples("ppocrv6_rec", tree / "verify", 4, 100)
    (tree / "rec.yaml").write_text(f"model: {model}\ninputs: {{{m.input}: {list(m.shape)}}}\ntargets: [SM8650]\n"
                                   "precision: fp16\nverify: {dir: verify, timeout_s: 1800}\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 0, r.text
    (y,) = json.loads((tmp_path / "out" / "SM8650" / "rec" / "rec_verify.json").read_text())["outputs"].values()
    assert y["cosine"] >= 0.9995 and y["snr_db"] > 32, y
