"""quantization.nodes by the names of the user's model, whatever prepare made of them: a T5-style RMSNorm written out
(which prepare fuses into one SimplifiedLayerNormalization) pinned by one of its nodes' names builds at fp16 as the
fused op (written out, its square overflows fp16) and at 16-bit activations as the whole written-out group; an
unknown name is the recipe's mistake (exit 2, one line, the close match); the search's answer names the user's
nodes and, pinned in the recipe, builds the same model again."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.graph.legalize import legalize
from ctxbuild.graph.nodenames import KEY, Names, named, outline, renamed, shown
from tests.conftest import TINY_CNN, assert_pin_rebuilds_from_cache, keep_only, records

NORM = ["pow", "mean", "add_eps", "sqrt", "div", "mul_norm"]  # the RMSNorm's nodes, as T5 exports write it


def _model(d: Path, constant_node: bool = False, named: bool = True) -> None:
    """x -> Mul (x100) -> RMSNorm written out -> MatMul -> y, with tokens whose scale spans 1..300 (a T5 residual
    stream's): the square reaches ~1e6, past fp16's 65504; 16-bit activations over that range hold no square of a
    quiet token (its mean square rounds to a step or 0), while the fused op in fp16 keeps every token.
    `constant_node`: the 100 comes from a Constant node ('hundred'), which prepare folds into an initializer.
    `named`: False leaves every node unnamed (as many exporters do)."""
    rng = np.random.default_rng(0)
    k = numpy_helper.from_array(np.array(100.0, np.float32), "k")
    inits = [*([] if constant_node else [k]),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 64).astype(np.float32), "gamma"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array((rng.normal(0, 1, (64, 32)) / 8).astype(np.float32), "w")]
    nodes = [*([helper.make_node("Constant", [], ["k"], name="hundred", value=k)] if constant_node else []),
             helper.make_node("Mul", ["x", "k"], ["h"], name="scale_up"),
             helper.make_node("Pow", ["h", "two"], ["sq"], name="pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean", keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"], name="add_eps"),
             helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
             helper.make_node("Div", ["h", "rms"], ["hn"], name="div"),
             helper.make_node("Mul", ["hn", "gamma"], ["normed"], name="mul_norm"),
             helper.make_node("MatMul", ["normed", "w"], ["y"], name="proj")]
    for n in nodes if not named else []:
        n.name = ""
    g = helper.make_graph(nodes, "t5norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])], inits)
    d.mkdir(parents=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), d / "t5norm.onnx")
    (d / "cal").mkdir()
    for i in range(8):
        tokens = 10 ** rng.uniform(-2, np.log10(3), (1, 16, 1))  # x 0.01..3 per token: h 1..300
        np.savez(d / "cal" / f"sample_{i:03}.npz", x=(rng.normal(0, 1, (1, 16, 64)) * tokens).astype(np.float32))


HEAD = "model: t5norm.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\n"


def _qdq(out: Path) -> onnx.ModelProto:
    (path,) = (out / ".ctxbuild" / "work").glob("*/quantized.onnx")
    return onnx.load(str(path), load_external_data=False)


def test_names_prepare_changed_map_to_the_prepared_nodes_and_back(tmp_path: Path) -> None:
    """The rmsnorm rule's rewrite, recorded as prepare records it: every node of the written-out RMSNorm becomes
    the fused op, named after its ReduceMean, which maps back to that user's name; kept nodes keep theirs."""
    _model(tmp_path / "m")
    user = onnx.load(str(tmp_path / "m" / "t5norm.onnx"))
    prepared = onnx.ModelProto()
    prepared.CopyFrom(user)
    done = legalize(prepared, ["rmsnorm"])
    assert done.rewrites == {"rmsnorm": 1} and len(done.steps) == 1
    record = renamed([outline(user), *done.steps])
    assert {k: record[k] for k in ("became", "from")} == {"became": {n: ["mean_rmsnorm"] for n in NORM},
                                                          "from": {"mean_rmsnorm": NORM}}
    # the RMSNorm's output is the fused op's now; its inner tensors and the constants it took as attributes are gone
    assert record["tensors"] == {"normed": "mean_rmsnorm_out"}
    assert record["folded"] == {**{t: ["mean_rmsnorm_out"] for t in ("sq", "ms", "mse", "rms", "hn")},
                                **{t: [] for t in ("two", "axes", "eps")}}
    assert record["tensor_from"] == {"mean_rmsnorm_out": "normed"}  # the way back, for the names shown
    helper.set_model_props(prepared, {KEY: json.dumps(record)})
    names = Names(prepared)
    assert [names.user_tensor(t) for t in ("mean_rmsnorm_out", "h", "y")] == ["normed", "h", "y"]
    assert [names.resolve(n) for n in ("mul_norm", "proj", "mean_rmsnorm", "maen")] == [
        ["mean_rmsnorm"], ["proj"], ["mean_rmsnorm"], None]
    assert names.user("mean_rmsnorm") == "mean" and names.user("proj") == "proj"
    assert names.close("maen") == "mean" and names.close("porj") == "proj"
    # the mixed rung adds to a candidate's pins by the diagnosis' names: one name per prepared node
    assert names.canonical({"pow": "fp16", "proj": {"weights": "int16"}}) == {"mean": "fp16",
                                                                              "proj": {"weights": "int16"}}
    assert renamed([outline(user), user.graph.node]) == {}  # nothing renamed: nothing recorded


def test_each_rewrite_maps_to_its_own_nodes() -> None:
    """An RMSNorm whose output an Einsum reads: two rules rewrite neighbours (einsum, then rmsnorm), and each user
    node maps to what its own rule made of it, step by step, not to the other rule's nodes as well."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), "gamma"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(rng.normal(0, 1, (16, 8)).astype(np.float32), "w")]
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean", keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"], name="add_eps"),
             helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
             helper.make_node("Div", ["x", "rms"], ["xn"], name="div"),
             helper.make_node("Mul", ["xn", "gamma"], ["normed"], name="mul_norm"),
             helper.make_node("Einsum", ["normed", "w"], ["y"], name="proj", equation="bij,jk->bik")]
    g = helper.make_graph(nodes, "norm_einsum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], inits)
    user = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    prepared = onnx.ModelProto()
    prepared.CopyFrom(user)
    done = legalize(prepared, ["einsum", "rmsnorm"])
    assert done.rewrites == {"einsum": 1, "rmsnorm": 1}
    record = renamed([outline(user), *done.steps])
    einsum = record["became"]["proj"]
    assert record["became"]["mean"] == ["mean_rmsnorm"] and "mean_rmsnorm" not in einsum and einsum, record
    assert {n.name for n in prepared.graph.node} == {"mean_rmsnorm", *einsum}
    helper.set_model_props(prepared, {KEY: json.dumps(record)})
    names = Names(prepared)
    assert names.user("mean_rmsnorm") == "mean" and {names.user(n) for n in einsum} == {"proj"}


def test_names_through_onnxruntimes_folding(tmp_path: Path) -> None:
    """What prepare's optimizer (onnxruntime, basic level) does, recorded the same way: a BatchNorm folded into its
    Conv maps to the Conv, a Shape chain folded into a constant maps to nothing (it runs nothing)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    c = 4
    inits = [numpy_helper.from_array(rng.normal(0, 1, (c, 3, 3, 3)).astype(np.float32), "w"),
             *(numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
                 ("gamma", rng.uniform(0.5, 1.5, c)), ("beta", rng.normal(0, 1, c)), ("mu", rng.normal(0, 1, c)),
                 ("var", rng.uniform(0.5, 1.5, c))))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mu", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape")]
    g = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])], inits)
    user = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(user, str(tmp_path / "user.onnx"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "prepared.onnx")
    ort.InferenceSession(str(tmp_path / "user.onnx"), so, providers=["CPUExecutionProvider"])
    prepared = onnx.load(str(tmp_path / "prepared.onnx"))
    assert [n.name for n in prepared.graph.node] == ["conv", "relu", "reshape"]  # what this test is about
    record = renamed([outline(user), prepared.graph.node])
    assert {k: record[k] for k in ("became", "from")} == {"became": {"bn": ["conv"], "shape": []}, "from": {}}
    helper.set_model_props(prepared, {KEY: json.dumps(record)})
    names = Names(prepared)
    assert [names.resolve(n) for n in ("bn", "shape", "conv")] == [["conv"], [], ["conv"]]
    assert names.user("conv") == "conv"


def test_an_exports_own_dequantizelinear_keeps_its_name() -> None:
    """An already-quantized export's DequantizeLinear is named as quantize_dynamic named it (`w_DequantizeLinear`),
    as a quantizer's own would be: QNN's refusal lists it as the export has it (the real T5 encoder's embedding
    table, tests/slow/test_legalize_real.py), not as "the DequantizeLinear of 'w'", which no quantizer made."""
    w = numpy_helper.from_array(np.ones((4, 4), np.int8), "w_quantized")
    nodes = [helper.make_node("DequantizeLinear", ["w_quantized", "s"], ["w"], name="w_DequantizeLinear"),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    g = helper.make_graph(nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                          [w, numpy_helper.from_array(np.array(0.5, np.float32), "s")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    refused = [("w_DequantizeLinear", "DequantizeLinear"), ("w_DequantizeLinear/duplicated_0", "DequantizeLinear")]
    assert named(model, refused) == [("the DequantizeLinear of 'w'", "DequantizeLinear")]  # no record: a quantizer's
    record = renamed([outline(model), outline(model)])
    assert record == {"qdq": ["w_DequantizeLinear"]}
    helper.set_model_props(model, {KEY: json.dumps(record)})
    assert named(model, refused) == [("w_DequantizeLinear", "DequantizeLinear")]


def _build(ctxbuild, tree: Path, recipe: str, out: Path, code: int = 0):
    """t5norm.yaml = HEAD + `recipe`, built into `out`; the exit code as expected."""
    (tree / "t5norm.yaml").write_text(HEAD + recipe)
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == code, r.text
    return r


def test_a_fused_rmsnorm_pinned_by_the_users_name_builds_at_fp16(tmp_path: Path, ctxbuild) -> None:
    """{mean: fp16}: the fused op stays whole and in float between the quantized nodes (the HTP runs QNN's RmsNorm
    in fp16, as an fp16 build does); {mul_norm: {activations: uint16}} on an 8-bit model: every written-out node of
    the RMSNorm computes 16-bit activations."""
    tree = tmp_path / "recipes"
    _model(tree)
    out = tmp_path / "out"
    _build(ctxbuild, tree, "precision: w8a16\nquantization: {nodes: {mean: fp16}}\nverify: {min_snr_db: 30}\n", out)
    assert records(out)["verify/t5norm@SM8650"]["result"]["passed"] is True
    qdq = _qdq(out)
    (norm,) = [n for n in qdq.graph.node if n.name == "mean_rmsnorm"]
    producer = {o: n.op_type for n in qdq.graph.node for o in n.output}
    assert norm.op_type == "SimplifiedLayerNormalization" and producer[norm.input[0]] == "DequantizeLinear"
    assert not {"Pow", "ReduceMean", "Sqrt"} & {n.op_type for n in qdq.graph.node}
    assert [n.op_type for n in qdq.graph.node if norm.output[0] in n.input] == ["QuantizeLinear"]
    # QNN's log names the quantizer's Q/DQ by prepare's tensors (and onnxruntime's copy of a DQ for each reader): a
    # refusal names them by the user's tensor they quantize, as quantization.tensors takes it
    qdq_nodes = [(n.name, n.op_type) for n in qdq.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                 and n.name.startswith(norm.output[0])]
    assert sorted(qdq_nodes) == [("mean_rmsnorm_out_DequantizeLinear", "DequantizeLinear"),
                                 ("mean_rmsnorm_out_QuantizeLinear", "QuantizeLinear")]
    seen = named(qdq, [*sorted(qdq_nodes), ("mean_rmsnorm_out_DequantizeLinear/duplicated_token_0",
                                            "DequantizeLinear"), ("proj", "MatMul")])
    assert [shown(*n) for n in seen] == ["the DequantizeLinear of 'normed'", "the QuantizeLinear of 'normed'",
                                         "proj (MatMul)"], seen  # the copy is the same node to the user

    out = tmp_path / "out8"
    _build(ctxbuild, tree, "precision: w8a8\nquantization: {nodes: {mul_norm: {activations: uint16}}}\nverify: false\n",
           out)
    qdq = _qdq(out)
    zero_point = {n.input[0]: n.input[2] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    types = {i.name: i.data_type for i in qdq.graph.initializer}
    written = [n for n in qdq.graph.node if n.name.startswith("mean_rmsnorm/")]
    assert len(written) == 6
    assert {types[zero_point[n.output[0]]] for n in written} == {TensorProto.UINT16}
    # QNN would name the written-out nodes and their tensors' Q/DQ so: they are the user's RMSNorm ('mean')
    sq = written[0].output[0]
    assert named(qdq, [(written[0].name, written[0].op_type), (f"{sq}_QuantizeLinear", "QuantizeLinear")]) == [
        ("mean", written[0].op_type), (f"the QuantizeLinear of '{sq}' (computed in 'mean')", "QuantizeLinear")]
    assert types[zero_point["h"]] == TensorProto.UINT8  # the node before it: the model's 8 bits


def test_an_unknown_node_name_is_exit_2_with_one_line(tmp_path: Path, ctxbuild) -> None:
    """A name neither model has: exit 2, one line with the closest of the user's names. A name prepare folded into
    a constant is the user's, so it builds, with a warning that its pin does nothing."""
    tree = tmp_path / "recipes"
    _model(tree, constant_node=True)
    r = _build(ctxbuild, tree, "precision: w8a16\nquantization: {nodes: {maen: fp16}}\n", tmp_path / "out", code=2)
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED ")]
    assert "quantization.nodes: 'maen' is not a node of the model (did you mean 'mean'?)" in line, line

    r = _build(ctxbuild, tree, "precision: w8a16\nquantization: {nodes: {hundred: fp16}}\nverify: false\n",
               tmp_path / "out")
    assert "quantization.nodes: hundred: folded into constants by prepare, nothing of them runs" in r.out, r.out


def test_the_searchs_answer_names_the_users_nodes_and_pinned_builds_the_same(tmp_path: Path, ctxbuild) -> None:
    """w8a16 loses the quiet tokens in the RMSNorm's square; the mixed rung keeps the RMSNorm in float, by the name
    the user's model has ('mean', not prepare's 'mean_rmsnorm'); the answer pasted in the recipe builds the same
    QDQ model, so its compile and verify are restored from the cache."""
    tree = tmp_path / "recipes"
    _model(tree)
    out = tmp_path / "out"
    r = _build(ctxbuild, tree, "precision: auto\nquantization: [{}]\nauto: {fp16: false}\nverify: {min_snr_db: 25}\n",
               out)
    s = json.loads((out / "SM8650" / "t5norm" / "t5norm_search.json").read_text())
    first, mixed = s["candidates"]
    assert first["state"] in ("rejected_cpu", "failed") and (mixed["state"], s["winner"]) == ("passed", "mixed"), s
    assert mixed["quantization"]["nodes"] == {"mean": "fp16"} and mixed["blamed"] == ["mean"]
    assert yaml.safe_load(s["pin"])["quantization"] == [{"nodes": {"mean": "fp16"}}]
    assert "the search's answer keeps mean at higher precision" in r.out
    # the diagnosis behind it names the tensor the user's model has too: the fused op's output carries 'normed'
    (culprits,) = [rec for k, rec in records(out).items() if k.startswith("culprits/")]
    assert {row["node"]: row["tensor"] for row in culprits["result"]["worst"]}["mean"] == "normed", culprits

    (tree / "t5norm.yaml").write_text(HEAD + "verify: {min_snr_db: 25}\n" + s["pin"])
    out2 = tmp_path / "out2"
    assert_pin_rebuilds_from_cache(ctxbuild, tree, out2)


def test_the_searchs_answer_pins_unnamed_nodes_by_their_outputs(tmp_path: Path, ctxbuild) -> None:
    """The same search on the model with no node names: the fused RMSNorm ('rmsnorm_rmsnorm', prepare's name) is
    the user's Mul computing the RMSNorm's output, named by that output ('normed'); the answer pins it so, which
    quantize resolves, and pasted in the recipe it rebuilds the same model."""
    tree = tmp_path / "recipes"
    _model(tree, named=False)
    out = tmp_path / "out"
    _build(ctxbuild, tree, "precision: auto\nquantization: [{}]\nauto: {fp16: false}\nverify: {min_snr_db: 25}\n",
           out)
    s = json.loads((out / "SM8650" / "t5norm" / "t5norm_search.json").read_text())
    mixed = s["candidates"][1]
    assert (mixed["state"], s["winner"]) == ("passed", "mixed") and mixed["quantization"]["nodes"] == {
        "normed": "fp16"}, s
    assert yaml.safe_load(s["pin"])["quantization"] == [{"nodes": {"normed": "fp16"}}]

    (tree / "t5norm.yaml").write_text(HEAD + "verify: {min_snr_db: 25}\n" + s["pin"])
    assert_pin_rebuilds_from_cache(ctxbuild, tree, tmp_path / "out2")


def test_a_refusal_the_recipes_override_causes_names_the_override(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """A 16-bit signed activation into the examples' 8-bit-weights Conv (`tensors: {r1: {type: int16}}`): QNN
    refuses conv2, and the hint names the override that set the types (it said only "set compile.cpu_fallback")."""
    keep_only(tree)
    (tree / "t.yaml").write_text(TINY_CNN + "precision: w8a8\n"
                                 "calibration: {dir: models/calib/tiny_cnn}\ntargets: [SM8650]\n"
                                 "quantization:\n  tensors:\n    r1: {type: int16}\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 1, r.text
    failed = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED compile/t@SM8650"))
    assert "conv2 (Conv)" in failed and "the recipe's quantization.tensors 'r1' set the types QNN refuses" in failed, failed
