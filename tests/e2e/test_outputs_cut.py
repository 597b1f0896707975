"""The recipe's `outputs:`: only the part of the model computing those tensors is built (graph/cut.py), verified
against the same tensors of the user's model; and the hints where a data-dependent node stops a build name the
line that builds the static part. Real QNN compiles and simulator runs of a MatMul whose output feeds NonZero."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ctxbuild.errors import ActionError
from ctxbuild.graph.cut import extract, split_line, static_outputs
from ctxbuild.verify.measure import cpu_outputs
from tests._hints import build_pasted, failed_line, pasted
from tests._qnn_models import IR_VERSION, OPSET, matmul_nonzero_model
from tests.conftest import last_build, records

RECIPE = "model: nz.onnx\ncalibration: {random: true}\nprecision: auto\ntargets: [SM8650]\n"


def _tree(tmp_path: Path, more: str = "") -> Path:
    onnx.save(matmul_nonzero_model(), tmp_path / "nz.onnx")
    (tmp_path / "nz.yaml").write_text(RECIPE + more)
    return tmp_path / "nz.yaml"


def test_the_hopeless_stop_names_the_cut_and_the_pasted_line_builds(tmp_path: Path, ctxbuild) -> None:
    recipe = _tree(tmp_path)
    line = failed_line(ctxbuild, recipe, tmp_path / "out", "select/nz@SM8650")
    assert ("w8a16: QNN cannot run NonZero at any precision: build the static part alone with `outputs: [h]` in the "
            "recipe (the rest, from NonZero 'nz' on, runs in the app); or set compile.cpu_fallback: true") in line, line

    out = tmp_path / "cut"
    wrapper, result = build_pasted(ctxbuild, recipe, RECIPE + pasted(line, "outputs") + "\n", out)
    assert [i.name for i in wrapper.graph.input] == ["x"] and [o.name for o in wrapper.graph.output] == ["h"]
    # compared with the tensor `h` of the user's model as given (not the prepared one)
    assert result["passed"] and result["reference"] == "original" and list(result["outputs"]) == ["h"]
    assert result["outputs"]["h"]["snr_db"] >= 20
    prepare = next(a for a in records(out) if a.startswith("prepare/"))

    # the same cut into a new OUT: restored from the cache; the uncut model's actions were others
    again = tmp_path / "again"
    r = ctxbuild("build", str(recipe), "-o", str(again))
    assert r.code == 0, r.text
    assert set(last_build(again).values()) == {"cache"}, last_build(again)
    assert prepare not in records(tmp_path / "out")


def test_a_name_the_model_does_not_have_exits_2(tmp_path: Path, ctxbuild) -> None:
    recipe = _tree(tmp_path, "outputs: [hh]\n")
    r = ctxbuild("plan", str(recipe))
    assert r.code == 2 and r.err.splitlines() == [
        f"ctxbuild: error: {recipe}:5: outputs: 'hh' is not a tensor of nz.onnx (did you mean 'h'?)"], r.text
    recipe.write_text(RECIPE + "outputs: [h, w]\n")
    r = ctxbuild("plan", str(recipe))
    assert r.code == 2 and "outputs: 'w' is a constant (initializer) of nz.onnx" in r.err, r.text


def test_the_cut_is_in_the_keys(tmp_path: Path, ctxbuild) -> None:
    """No `outputs:`: no param (the keys stay as they were); each cut: its own prepare and reference."""
    recipe = _tree(tmp_path)
    plans = {}
    for cut in ("", "outputs: [h]\n", "outputs: [h, c]\n"):
        recipe.write_text(RECIPE + cut)
        r = ctxbuild("plan", str(recipe), "--format", "json")
        assert r.code == 0, r.text
        plans[cut] = {a["kind"]: a for a in json.loads(r.out)["actions"]}
    assert "outputs" not in plans[""]["prepare"]["params"] and "outputs" not in plans[""]["verify"]["params"]
    assert plans["outputs: [h]\n"]["verify"]["params"]["outputs"] == ["h"]
    assert plans["outputs: [h, c]\n"]["screen"]["params"]["outputs"] == ["h", "c"]
    assert len({p["prepare"]["id"] for p in plans.values()}) == 3


def test_the_static_part_before_the_data_dependent_nodes() -> None:
    """The tensors the rest reads, computed from the inputs (not constants, not a shape), plus the model outputs the
    static part computes; an If's branches read outer tensors too. The cut keeps every input of the model."""
    branch = lambda name: helper.make_graph(  # noqa: E731
        [helper.make_node("Identity", ["outer"], [f"o_{name}"])], name, [],
        [helper.make_tensor_value_info(f"o_{name}", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("Relu", ["x"], ["outer"], name="relu"),
             helper.make_node("Sigmoid", ["x"], ["side"], name="side"),
             helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Cast", ["s"], ["cond"], to=TensorProto.BOOL, name="cast"),
             helper.make_node("If", ["cond"], ["picked"], name="branchy", then_branch=branch("a"), else_branch=branch("b")),
             helper.make_node("Reshape", ["picked", "shape"], ["y"], name="back")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                       helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
                           helper.make_tensor_value_info("side", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION)
    assert static_outputs(model, {5}) == ["outer", "side", "cond"]
    assert split_line(model) == ("build the static part alone with `outputs: [outer, side, cond]` in the recipe "
                                 "(the rest, from If 'branchy' on, runs in the app)")
    cut = extract(model, ["outer", "cond"])
    onnx.checker.check_model(cut, full_check=True)
    assert [n.name for n in cut.graph.node] == ["relu", "sum", "cast"]
    assert [i.name for i in cut.graph.input] == ["x", "unused"] and [o.name for o in cut.graph.output] == ["outer", "cond"]
    assert split_line(cut) is None
    first = helper.make_graph([helper.make_node("NonZero", ["x"], ["i"], name="where")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    assert split_line(helper.make_model(first, opset_imports=OPSET, ir_version=IR_VERSION)) == (
        "nothing before NonZero 'where' computes from the model's inputs: there is no static part for `outputs:` to "
        "build alone; run the model on the CPU EP in the app")


def _sized_by_data(x: str) -> list:
    """Relu(x) summed into a count, a Range up to it, NonZero of that: sizes that follow the data (y, nz)."""
    return [helper.make_node("Relu", [x], ["r"], name="relu"),
            helper.make_node("ReduceSum", ["r"], ["s"], keepdims=0, name="sum"),
            helper.make_node("Cast", ["s"], ["n"], to=TensorProto.INT64, name="count"),
            helper.make_node("Range", ["zero", "n", "one"], ["steps"], name="steps"),
            helper.make_node("Cast", ["steps"], ["y"], to=TensorProto.FLOAT, name="to_float"),
            helper.make_node("NonZero", ["y"], ["nz"], name="nz")]


def test_sizes_that_follow_the_data_without_a_known_op(tmp_path: Path) -> None:
    """A length computed from the data (Range up to a sum) has no op of the list: the samples whose output sizes
    differ find where the sizes start to differ, and the hint names that node; a NonZero after it does not move
    the cut past it (a TTS voice's durations before its iSTFT's NonZero)."""
    g = helper.make_graph(_sized_by_data("x"), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("nz", TensorProto.INT64, None)],
                          [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
                           helper.make_tensor("one", TensorProto.INT64, [], [1])])
    onnx.save(helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION), tmp_path / "range.onnx")
    samples = [{"x": np.full((1, 8), v, np.float32)} for v in (0.25, 1.0)]
    with pytest.raises(ActionError) as e:
        cpu_outputs(tmp_path / "range.onnx", samples)
    assert e.value.hint.endswith("split the model: build the static part alone with `outputs: [n]` in the recipe "
                                 "(the rest, from Range 'steps', NonZero 'nz' on, runs in the app)"), e.value.hint


def test_a_scalar_among_the_tensors_cut_at(tmp_path: Path) -> None:
    """A cut may end at a scalar (a count, a length): the reference stacks it over the samples as the simulator's
    side does (Kokoro's static part: the durations' total among its outputs)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("ReduceSum", ["r"], ["s"], keepdims=0, name="sum")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 8]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [])])
    onnx.save(helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION), tmp_path / "sum.onnx")
    got = cpu_outputs(tmp_path / "sum.onnx", [{"x": np.full((1, 8), v, np.float32)} for v in (0.5, 1.0)])
    assert got["s"].tolist() == [4.0, 8.0] and got["r"].shape == (2, 8)


def test_a_direct_build_refused_on_data_dependent_nodes_names_the_cut(tmp_path: Path, ctxbuild) -> None:
    """Kokoro-82M built whole at fp16: the compile refused 1453 nodes and named only cpu_fallback, while prepare's
    sample check had met the outputs' sizes following the data (and the line that builds the static part). The
    refusal now leads with that line, found on the samples: here the cut before the Range the data sizes, not only
    before the NonZero. (A log_power front end makes prepare check its rewrite on the samples.)"""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
             helper.make_node("Add", ["sq", "eps"], ["p"], name="floor"),
             helper.make_node("Log", ["p"], ["l"], name="log"), *_sized_by_data("l")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("nz", TensorProto.INT64, None)],
                          [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
                           helper.make_tensor("one", TensorProto.INT64, [], [1]),
                           helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-10])])
    onnx.save(helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION), tmp_path / "tts.onnx")
    (tmp_path / "cal").mkdir()
    for k, v in enumerate((2.0, 3.0, 5.0, 8.0)):
        np.save(tmp_path / "cal" / f"s{k}.npy", np.full((1, 8), v, np.float32))
    (tmp_path / "tts.yaml").write_text("model: tts.onnx\nprecision: fp16\ntargets: [SM8650]\ncalibration: {dir: cal}\n")
    r = ctxbuild("build", str(tmp_path / "tts.yaml"), "-o", str(tmp_path / "out"))
    assert r.code == 1, r.text
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED compile/")]
    assert ("NonZero: its size depends on the input data, which QNN's fixed shapes cannot follow: split the model: "
            "build the static part alone with `outputs: [n]` in the recipe (the rest, from Range 'steps', NonZero "
            "'nz' on, runs in the app)") in line, line
