"""Per-layer diagnosis (`ctxbuild verify --layers`): where accuracy goes, quantization vs the HTP."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import TINY_CNN
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
        TINY_CNN + "precision: w8a16\n"
        "calibration: {dir: flat}\ntargets: [SM8650]\nverify: {dir: models/calib/tiny_cnn}\n")


def test_quantization_loss_is_named_per_node(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """Recipes and OUT elsewhere than recipes/ and out/: the hint's `verify --layers` command names them (it said
    `ctxbuild verify --layers flat`, which looks in recipes/), so pasting it diagnoses what was built."""
    _flat_calibration(tree)
    tree = tree.rename(tmp_path / "npu recipes")
    out = tmp_path / "build" / "npu"
    r = ctxbuild("build", "npu recipes", "-o", "build/npu")
    assert r.code == 1
    line = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED verify/flat@SM8650"))
    # the hint, from the CPU half: calibrated on zeros, conv1's bias cannot fit its int32 scale
    assert "quantization loses it: the biases of conv1" in line and "calibration samples" in line
    command = re.search(r"`ctxbuild (verify --layers flat[^`]*)`", line)
    assert command and command[1] == "verify --layers flat 'npu recipes' -o build/npu", line

    r = ctxbuild(*shlex.split(command[1]))
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
    assert [f["cause"].count(command[0]) for f in report["failures"]] == [1], report["failures"]  # the report's too


def test_float_model_loss_is_the_htps(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """fp16: no quantization step, so every bit of loss the diagnosis finds is the HTP's."""
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "mlp_fp16", "--target", "SM8650", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    d = json.loads((out / "SM8650" / "mlp_fp16" / "mlp_fp16_layers.json").read_text())
    assert d["where"] == "htp"
    # it passes: said first, and no fix offered (it read "loss is mostly in htp" with a hint naming nodes to pin)
    assert d["meets"] and d["hint"].startswith("nothing to fix") and "meets the thresholds" in r.out, r.out
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


def test_layers_on_a_split_outputs_recipe(tmp_path: Path, ctxbuild) -> None:
    """The weak-slice hint's fix, `compile: {split_outputs: true}`, then `verify --layers` as the next hint says: it
    stopped with "output '<a Concat's tensor>__probe': ... cannot cut the Concat off (drop this output from
    split_outputs)" (NudeNet's YOLOv8), splitting the probes of inner Concats as if they were outputs; and its
    hint offered split_outputs again. Now it splits the graph's own outputs and offers another fix."""
    tree = write_tree(tmp_path / "recipes", {"det": "compile: {split_outputs: true}\n"})
    model = onnx.load(str(tree / "det.onnx"))  # the stem doubled by an inner Concat, as YOLO's blocks do
    model.graph.node.insert(2, helper.make_node("Concat", ["r1", "r1"], ["wide"], name="inner_concat", axis=1))
    rng = np.random.default_rng(2)
    for n in model.graph.node:
        if n.name in ("box_conv", "score_conv"):
            n.input[0] = "wide"
    for i, init in enumerate(model.graph.initializer):
        if init.name in ("wb", "ws"):
            shape = (init.dims[0], 2 * init.dims[1], 1, 1)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(
                (rng.standard_normal(shape) * 0.3).astype(np.float32), init.name))
    onnx.save(model, tree / "det.onnx")
    r = ctxbuild("verify", "--layers", "det", str(tree), "-o", str(tmp_path / "out"))
    assert "cannot cut the Concat off" not in r.err and "Traceback" not in r.err, r.text
    d = json.loads((tmp_path / "out" / "SM8650" / "det" / "det_layers.json").read_text())
    assert d["probe_runs"] and "split_outputs" not in d["hint"], d["hint"]


def test_layers_needs_a_known_recipe(tree: Path, tmp_path: Path, ctxbuild) -> None:
    r = ctxbuild("verify", "--layers", "nope", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2 and "--layers nope: no such recipe" in r.err


def _chain_cnn(culprit: str | None) -> onnx.ModelProto:
    """Four Conv+Relu layers, pooled, a classifier. `culprit`: that conv's dead output channel 0 (a bias
    so negative the Relu always zeroes it: the float model does not change) gets one weight 60x the layer's
    largest, so the per-tensor uint8 weight scale leaves every live weight of the layer a step or two: the
    one layer whose quantization is known to break."""
    rng = np.random.default_rng(1)
    chans = [3, 8, 8, 8, 8]
    inits, nodes, x = [], [], "image"
    for i in range(1, 5):
        w = (rng.standard_normal((chans[i], chans[i - 1], 3, 3)) * 0.3).astype(np.float32)
        b = (rng.standard_normal(chans[i]) * 0.05).astype(np.float32)
        if f"conv{i}" == culprit:
            w[0] = 0
            w[0, 0, 1, 1] = 60 * np.abs(w).max()
            b[0] = -1e4
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    inits += [numpy_helper.from_array((rng.standard_normal((8, 10)) * 0.3).astype(np.float32), "wf"),
              numpy_helper.from_array(np.zeros(10, np.float32), "bf")]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["p"], name="gap"),
              helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
              helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("culprit", ["conv2", "conv3"])
def test_diagnosis_names_the_injected_culprit(culprit: str, tmp_path: Path, ctxbuild) -> None:
    """Quantization broken in one known layer: the diagnosis blames that layer, measured like with like
    through the quantizer's Conv+Relu fusion (the Relus are not in the QDQ model)."""
    tree = tmp_path / "recipes"
    (tree / "calib").mkdir(parents=True)
    onnx.save(_chain_cnn(culprit), tree / "chain.onnx")
    rng = np.random.default_rng(2)
    for i in range(4):
        np.save(tree / "calib" / f"s{i}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    (tree / "chain.yaml").write_text("model: chain.onnx\ninputs: {image: [1, 3, 16, 16]}\nprecision: w8a16\n"
                                     "calibration: {dir: calib}\ntargets: [SM8650]\nverify: {min_snr_db: 36}\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1, r.text
    failed = next(ln for ln in r.err.splitlines() if "verify/chain@SM8650" in ln)
    assert f"most at {culprit} (Conv+Relu)" in failed  # verify's own hint, from the CPU half
    r = ctxbuild("verify", "--layers", "chain", str(tree), "-o", str(out))
    assert r.code == 1, r.text
    d = json.loads((out / "SM8650" / "chain" / "chain_layers.json").read_text())
    worst = d["worst_quantization"]
    assert worst[0]["node"] == culprit and worst[0]["op_type"] == "Conv+Relu", worst
    assert worst[0]["fused"] == [f"relu{culprit[-1]}"]
    # the noise the culprit adds dwarfs every other layer's; the layers before it keep what 16-bit
    # activations and 8-bit weights keep (compared after the fused Relu's QuantizeLinear, clamped at 0,
    # not as the Conv's raw output: that compare measured -9 dB for a clean layer)
    assert all(worst[0]["quant_added_db"] > n["quant_added_db"] + 6 for n in worst[1:]), worst
    before = [n for n in worst if n["node"].startswith("conv") and n["node"] < culprit]
    assert before and all(n["quant_snr_db"] > 35 for n in before), worst
    assert d["where"] == "quantization" and f"{culprit} (Conv+Relu)" in d["hint"]
    assert "16-bit activations already" in d["hint"]  # not advised for a recipe at 16 bits


def test_long_node_names_are_shown_whole() -> None:
    """`verify --layers` rows of an exporter's graph share long scopes: the table shows each name whole, as the
    user's model has it (cut at the right, every row read '/model/layers.0/self_attn/...'; cut at the left, a
    name matched nothing in the model)."""
    from ctxbuild.verify.diagnose import format_text

    def row(node: str) -> dict:
        return {"node": node, "op_type": "MatMul", "weight_snr_db": 40.0, "quant_snr_db": 20.0, "quant_added_db": 3.0,
                "htp_snr_db": 19.0, "htp_added_db": 1.0}

    names = [f"jax2tf_get_logits_/pjit_get_logits_/MagikaV2/layers.0/self_attn/{p}_proj/MatMul" for p in "qkv"]
    d = {"graph": "g", "target": "SM8650", "where": "quantization", "samples": 2, "outputs": {}, "hint": "h",
         "worst_quantization": [row(n) for n in names], "worst_htp": [row("short")]}
    rows = [line.split() for line in format_text(d).splitlines() if "MatMul" in line]
    assert [r[0] for r in rows] == names + ["short"], rows
    assert len({line.index("MatMul  ") for line in format_text(d).splitlines() if "MatMul  " in line}) == 1


def test_hint_for_weightless_nodes_names_no_weights() -> None:
    """The loss at nodes without weights (Magika's softmax: Exp, Max, Tanh) at 16-bit activations: the hint
    used to say "16-bit weights for nodes Exp, Max, Tanh"; now it says they have none, and the field that
    keeps their range (fp16: for them alone, quantization.nodes, or precision: fp16); a weighted node among them
    gets the quantization.nodes line."""
    from ctxbuild.verify.advice import likely_fix

    worst = [{"node": "/softmax/Exp", "op_type": "Exp"}, {"node": "/softmax/Max", "op_type": "Max"},
             {"node": "/head/MatMul", "op_type": "MatMul"}]
    hint = likely_fix("quantization", worst, {}, {}, 16)
    assert "'/softmax/Exp': {weights" not in hint and "'/softmax/Max': {weights" not in hint, hint
    assert ("/softmax/Exp, /softmax/Max have no weights: fp16 keeps their range, for them alone (quantization.nodes: "
            "{'/softmax/Exp': fp16, '/softmax/Max': fp16}) or the whole model (precision: fp16)") in hint, hint
    assert "quantization.nodes: {'/head/MatMul': {weights: int16}}" in hint, hint
    only = likely_fix("quantization", worst[:2], {}, {}, 16)
    assert "weights: int16" not in only and "per-channel" not in only, only
    htp = likely_fix("htp", worst[:2], {}, {}, 8)
    assert "quantization.nodes: {'/softmax/Exp': {activations: uint16}, '/softmax/Max': {activations: uint16}}" in htp
    assert "weights" not in htp and "cpu_fallback" not in htp, htp


def test_an_fp16_hint_for_a_node_between_quantized_ones_names_its_neighbour_too() -> None:
    """The diagnosis' fp16 advice for a weightless node ({'/softmax/Exp': fp16} "for them alone") changes nothing
    where its neighbours are quantized (the quantizer puts Q/DQ around it, QNN runs it quantized; quantize warns so
    once pasted). The hint now pins the neighbour with it (verify/islands.widen_lone) and says why."""
    from ctxbuild.verify.advice import likely_fix

    worst = [{"node": "/softmax/Exp", "op_type": "Exp"}, {"node": "/softmax/Max", "op_type": "Max"}]
    hint = likely_fix("quantization", worst, {}, {}, 16, neighbours={"/softmax/Exp": "/softmax/Sub"})
    assert ("/softmax/Exp, /softmax/Max have no weights: fp16 keeps their range, for them alone (quantization.nodes: "
            "{'/softmax/Exp': fp16, '/softmax/Sub': fp16, '/softmax/Max': fp16}; /softmax/Sub with /softmax/Exp, "
            "which alone between quantized nodes would run quantized) or the whole model (precision: fp16)") in hint, hint
    htp = likely_fix("htp", worst, {}, {}, 16, neighbours={"/softmax/Exp": "/softmax/Sub"})
    assert ("keep them in float, the HTP runs them in fp16 (quantization.nodes: {'/softmax/Exp': fp16, "
            "'/softmax/Sub': fp16, '/softmax/Max': fp16}; /softmax/Sub with /softmax/Exp, which alone between "
            "quantized nodes would run quantized)") in htp, htp


def test_fp16_cause_names_the_overflow_and_the_huge_constant() -> None:
    """The float values of the model say what fp16 cannot hold: the first node whose values pass 65504 (a sum
    of squares), else a worst node reading an infinite constant (a softmax's Max(-inf, m))."""
    from onnx import TensorProto, helper, numpy_helper

    from ctxbuild.verify.advice import FP16_FIX, fp16_cause

    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
             helper.make_node("ReduceSum", ["sq"], ["s"], name="sum_of_squares", keepdims=1),
             helper.make_node("Max", ["neg_inf", "s"], ["y"], name="floor")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
                              [numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf")])
    model = helper.make_model(graph)
    acts = {"sq": [np.full(512, 400.0 ** 2 / 10)], "s": [np.array([8.2e6])], "y": [np.array([8.2e6])]}
    assert fp16_cause(model, acts, []) == ("fp16 overflow: sum_of_squares (ReduceSum) computes values up to 8.2e+06 "
                                           "in float, beyond fp16's 65504", FP16_FIX)
    small = {k: [v[0] / 1e3] for k, v in acts.items()}
    assert fp16_cause(model, small, []) is None
    assert fp16_cause(model, small, ["floor"]) == ("floor (Max) reads the constant neg_inf = -inf, beyond fp16's 65504",
                                                   FP16_FIX)


def test_fp16_cause_names_the_log_of_an_underflowing_power() -> None:
    """Whisper's log-mel: Log(Clip(mel, 1e-10)). The floor is 0 in fp16, the spectrum's quiet bins are below its
    normal range, and the HTP's Log(0) is finite: the cause names the Log, its floor and the fix."""
    from onnx import TensorProto, helper, numpy_helper

    from ctxbuild.verify.advice import fp16_cause

    nodes = [helper.make_node("Clip", ["mel", "lo"], ["floored"], name="n18"),
             helper.make_node("Log", ["floored"], ["y"], name="n19")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 80])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 80])],
                              [numpy_helper.from_array(np.array(1e-10, np.float32), "lo")])
    model = helper.make_model(graph)
    acts = {"floored": [np.array([1e-10, 3e-4, 21.5])], "y": [np.log([1e-10, 3e-4, 21.5])]}
    cause, fix = fp16_cause(model, acts, [])
    assert cause == ("fp16 underflow: n19 (Log) reads values down to 1e-10 in float (n18 (Clip) floors them at 1e-10, "
                     "0 in fp16); the HTP flushes values under 6.1e-05 to 0 and its Log(0) is -7.6, not -inf"), cause
    assert "log_power" in fix, fix
    assert fp16_cause(model, {"floored": [np.array([1e-3, 21.5])]}, []) is None


def test_fp16_cause_of_a_log_the_rule_scaled() -> None:
    """basic-pitch after prepare's log_power rule (0.9993 / 28.5 dB at fp16): its own Log still reads values under
    fp16's normal range, the spectrum spanning more than fp16 holds. The cause says the rule applied (it said "its
    record says why it did not apply") and the fix names a field that exists."""
    from ctxbuild.graph.legalize import legalize
    from ctxbuild.verify.advice import fp16_cause

    nodes = [helper.make_node("Mul", ["x", "x"], ["power"], name="square"),
             helper.make_node("Add", ["power", "eps"], ["floored"], name="add"),
             helper.make_node("Log", ["floored"], ["y"], name="log")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 80])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 80])],
                              [numpy_helper.from_array(np.array(1e-10, np.float32), "eps")])
    model = helper.make_model(graph)
    assert legalize(model).rewrites == {"log_power": 1}
    (scaled,) = [n for n in model.graph.node if n.op_type == "Log" and n.doc_string]  # not the Log of the scale
    cause, fix = fp16_cause(model, {scaled.input[0]: [np.array([3e-8, 21.5])]}, [])
    assert "even scaled into fp16's range by prepare's log_power rule" in cause and "did not apply" not in fix, cause
    assert "verify.min_snr_db" in fix, fix


def test_an_integer_output_is_left_out(tmp_path: Path, ctxbuild) -> None:
    """A front end returns its features and their count (an int64 the export computes from a Shape): the
    diagnosis compares the float output and leaves the count out (it stopped with KeyError on it)."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["doubled"], name="double"),
             helper.make_node("Relu", ["doubled"], ["y"], name="relu"),
             helper.make_node("Shape", ["lens"], ["lens_shape"]),
             helper.make_node("ConstantOfShape", ["lens_shape"], ["count"],
                              value=numpy_helper.from_array(np.array([8], np.int64)))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                                           helper.make_tensor_value_info("lens", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8]),
                               helper.make_tensor_value_info("count", TensorProto.INT64, [1])],
                              [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    tree = tmp_path / "recipes"
    tree.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
              tree / "front.onnx")
    (tree / "front.yaml").write_text("model: front.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "front", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    d = json.loads((out / "SM8650" / "front" / "front_layers.json").read_text())
    assert list(d["outputs"]) == ["y"] and d["outputs"]["y"]["htp"]["cosine"] > 0.999, d["outputs"]
