"""The user's names where prepare and the quantizer change them, on a model whose exporter named no node (as many
do): quantization.nodes takes an unnamed node by its first output (what the diagnosis prints), quantization.tensors
takes the user's tensor names through prepare's rewrites (a tensor folded away is exit 2 naming what to set
instead), and QNN's refusal at compile names the user's nodes, not the prepared or QDQ model's."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.graph.nodenames import KEY, Names, named
from ctxbuild.verify.advice import weights_per_node

HEAD = "model: convnet.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\n"


def _model(d: Path) -> None:
    """x -> Conv -> BatchNorm -> Relu -> Identity -> Reshape -> MatMul -> Add -> y, every node unnamed. prepare's
    folding (onnxruntime, basic level) folds the BatchNorm into the Conv (which writes 'b' now, from new weights),
    drops the Identity (the Reshape reads 'r') and fuses MatMul + Add into a Gemm it names '/MatMulAddFusion'."""
    rng = np.random.default_rng(0)
    c = 4
    inits = [numpy_helper.from_array((rng.normal(0, 1, (c, 3, 3, 3)) / 4).astype(np.float32), "w"),
             *(numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
                 ("gamma", rng.uniform(0.5, 1.5, c)), ("beta", rng.normal(0, 1, c)), ("mu", rng.normal(0, 1, c)),
                 ("var", rng.uniform(0.5, 1.5, c)))),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
             numpy_helper.from_array((rng.normal(0, 1, (c * 64, 10)) / 16).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mu", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["r"]),
             helper.make_node("Identity", ["r"], ["ri"]),
             helper.make_node("Reshape", ["ri", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w2"], ["mm"]),
             helper.make_node("Add", ["mm", "b2"], ["y"])]
    g = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    d.mkdir(parents=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), d / "convnet.onnx")
    (d / "cal").mkdir()
    for i in range(4):
        np.savez(d / "cal" / f"sample_{i:03}.npz", x=rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32))


def _build(ctxbuild, tree: Path, recipe: str, out: Path, code: int = 0):
    (tree / "convnet.yaml").write_text(HEAD + recipe)
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == code, r.text
    return r


def _work(out: Path, name: str) -> onnx.ModelProto:
    (path,) = (out / ".ctxbuild" / "work").glob(f"*/{name}.onnx")
    return onnx.load(str(path), load_external_data=False)


def _failed_line(r) -> str:
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED ")]
    return line


def test_unnamed_nodes_and_the_users_tensors_pin_what_prepare_made_of_them(tmp_path: Path, ctxbuild) -> None:
    """prepare records the unnamed nodes and the tensors it changed; {mm: fp16} (the unnamed MatMul, by its output)
    leaves the Gemm it became in float, and tensors {ri: {type: uint16}} (the Identity's output, gone) sets the tensor carrying its value. A per-tensor type
    is a mixed-precision override, which onnxruntime's quantizer refuses on a model with unnamed nodes ("does not
    have a name!"): quantize names them by their first outputs."""
    tree = tmp_path / "recipes"
    _model(tree)
    out = tmp_path / "out"
    _build(ctxbuild, tree, "precision: w8a8\nquantization:\n  nodes: {mm: fp16}\n"
           "  tensors: {ri: {type: uint16}}\nverify: false\n", out)
    prepared = _work(out, "prepared")
    record = json.loads({p.key: p.value for p in prepared.metadata_props}[KEY])
    assert record["became"] == {"c": ["b"], "ri": [], "mm": ["/MatMulAddFusion"], "y": ["/MatMulAddFusion"]}, record
    assert record["tensors"] == {"ri": "r"} and record["folded"]["c"] == ["b"], record
    assert record["folded"]["w"] == ["ConvBnFusion_W_w", "ConvBnFusion_BN_B_beta"], record
    names = Names(prepared)
    assert [names.label(n) for n in prepared.graph.node] == ["b", "r", "flat", "y"]  # the diagnosis' row names
    # the weights' SNR per node, as the hints name them (unnamed nodes were all '' and one hid the other)
    assert weights_per_node(prepared, {"ConvBnFusion_W_w": 20.0, "w2": 40.0}) == {"b": 20.0, "y": 40.0}

    qdq = _work(out, "quantized")
    by_op = {n.op_type: n for n in qdq.graph.node}
    assert by_op["Gemm"].input[1] == "w2" and by_op["Gemm"].output[0] == "y"  # in float: weight, output
    assert by_op["Conv"].name == "b" and by_op["Relu"].name == "r"  # named by their keys for the quantizer
    zero_point = {n.input[0]: n.input[2] for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    types = {i.name: i.data_type for i in qdq.graph.initializer}
    assert types[zero_point["r"]] == TensorProto.UINT16  # the Relu's output, which 'ri' was
    assert types[zero_point["x"]] == types[zero_point["b"]] == TensorProto.UINT8  # the rest: the model's 8 bits
    # QNN's log names the quantizer's Q/DQ by the QDQ model's names: a refusal names the user's tensors instead
    assert [name for name, _ in named(qdq, [("ConvBnFusion_W_w_DequantizeLinear", "DequantizeLinear"),
                                            ("r_QuantizeLinear", "QuantizeLinear"),
                                            ("b_DequantizeLinear_2", "DequantizeLinear")])] == [
        "the DequantizeLinear of 'ConvBnFusion_W_w' (prepare's, folded from 'w', 'gamma', 'beta', 'mu', ...)",
        "the QuantizeLinear of 'r'", "the DequantizeLinear of 'b'"]


def test_names_neither_model_has_or_prepare_folded_are_exit_2(tmp_path: Path, ctxbuild) -> None:
    """One line each, exit 2: a node name with a typo (the close match is the unnamed MatMul's output), a tensor
    name with a typo, a weight prepare folded into its Conv's new constants (what to set instead)."""
    tree = tmp_path / "recipes"
    _model(tree)
    out = tmp_path / "out"
    for recipe, said in [
        ("nodes: {mm_: fp16}", "quantization.nodes: 'mm_' is not a node of the model (did you mean 'mm'?)"),
        ("tensors: {flta: {type: uint16}}", "quantization.tensors: 'flta' is not a tensor of the model "
                                           "(did you mean 'flat'?)"),
        ("tensors: {w: {axis: 0}}", "quantization.tensors: 'w' was folded away by prepare (no tensor of the prepared "
                                    "model carries its value) (set 'ConvBnFusion_W_w' or 'ConvBnFusion_BN_B_beta' "
                                    "instead, which prepare computes from it in its place)"),
    ]:
        r = _build(ctxbuild, tree, f"precision: w8a16\nquantization: {{{recipe}}}\nverify: false\n", out, code=2)
        assert said in _failed_line(r), r.err


def test_qnns_refusal_names_the_users_nodes(tmp_path: Path, ctxbuild) -> None:
    """uint16 (asymmetric) weights on a Gemm, a signed 16-bit input to a Conv: QNN refuses them (measured,
    onnxruntime-qnn 2.7.0). Its log names the prepared model's '/MatMulAddFusion', an unnamed Gemm '' and the name
    onnxruntime's optimizer gives the Conv at compile ('b_token_<n>'); the refusal names the user's nodes: the Add
    the fused Gemm computes ('y'), the unnamed Gemm by its first output, which the QDQ model renames
    'z_QuantizeLinear_Input' ('z'), the Conv by its first output ('b', which the Conv writes once the BatchNorm is
    folded into it)."""
    tree = tmp_path / "recipes"
    _model(tree)
    m = onnx.load(str(tree / "convnet.onnx"))
    m.graph.initializer.append(numpy_helper.from_array(np.eye(10, dtype=np.float32), "w3"))
    m.graph.node.append(helper.make_node("Gemm", ["y", "w3"], ["z"]))
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 10]))
    onnx.save(m, str(tree / "convnet.onnx"))
    r = _build(ctxbuild, tree, "precision: w8a16\nquantization: {tensors: {w2: {type: uint16}, w3: {type: uint16}, "
               "x: {type: int16}}}\nverify: false\n", tmp_path / "out", code=1)
    line = _failed_line(r)
    assert "QNN cannot run 3 node(s): y (Gemm), z (Gemm), b (Conv) (the recipe's quantization.tensors 'w2', 'w3', " \
        "'x' set the types QNN refuses for these nodes: change or remove those overrides (or set " \
        "compile.cpu_fallback: true" in line, line  # the overrides that made the refused types, by the user's names
