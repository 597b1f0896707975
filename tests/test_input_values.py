"""The recipe's `input_values:`: an input the app always sets to one value becomes a constant, and the If it
decides keeps that branch (graph/inputvalues.py), so a model exported with a branch on a setting builds whole;
verified against the user's model run with that input set. Real QNN compile and simulator run of a MatMul model
whose `If(mode == 1)` chooses between two weights, with an If inside decided by the input's shape."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.errors import RecipeError
from ctxbuild.graph.inputvalues import apply, inline_decided
from ctxbuild.plan.planner import make_plan
from ctxbuild.recipes import recipe as recipe_set
from tests._qnn_models import IR_VERSION, OPSET

RECIPE = "model: branchy.onnx\nprecision: fp16\ntargets: [SM8650]\nverify: {dir: samples}\n"


def branchy_model() -> onnx.ModelProto:
    """y = x @ W1 (then: mode == 1) or x @ W2; the then branch holds an If on Shape(x)[1] == 16 (a shape the fixed
    input decides) between Relu and Sigmoid."""
    rng = np.random.default_rng(0)
    w1, w2 = (numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), n) for n in ("w1", "w2"))
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 16])  # noqa: E731
    inner = helper.make_node(
        "If", ["wide"], ["act"], name="by_width",
        then_branch=helper.make_graph([helper.make_node("Relu", ["h1"], ["r"], name="relu")], "t", [], [out("r")]),
        else_branch=helper.make_graph([helper.make_node("Sigmoid", ["h1"], ["s"], name="sig")], "e", [], [out("s")]))
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
                              helper.make_node("Shape", ["x"], ["xs"], name="shape"),
                              helper.make_node("Gather", ["xs", "one"], ["width"], name="width", axis=0),
                              helper.make_node("Equal", ["width", "sixteen"], ["wide"], name="is_wide"), inner],
                             "then", [], [out("act")],
                             [numpy_helper.from_array(np.array(1, np.int64), "one"),
                              numpy_helper.from_array(np.array(16, np.int64), "sixteen")])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "w2"], ["h2"], name="fc2")], "else", [], [out("h2")])
    nodes = [helper.make_node("Equal", ["mode", "mode_one"], ["is_one"], name="is_one"),
             helper.make_node("If", ["is_one"], ["y"], name="by_mode", then_branch=then, else_branch=other)]
    g = helper.make_graph(nodes, "branchy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                                             helper.make_tensor_value_info("mode", TensorProto.INT64, [])],
                          [out("y")], [w1, w2, numpy_helper.from_array(np.array(1, np.int64), "mode_one")])
    return helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION)


def _tree(tmp_path: Path, mode: int = 1) -> Path:
    onnx.save(branchy_model(), tmp_path / "branchy.onnx")
    (tmp_path / "samples").mkdir()
    rng = np.random.default_rng(1)
    for i in range(2):  # recorded from the app: the setting is in them
        np.savez(tmp_path / "samples" / f"s{i}.npz", x=rng.standard_normal((1, 16)).astype(np.float32),
                 mode=np.array(mode, np.int64))
    (tmp_path / "branchy.yaml").write_text(RECIPE)
    return tmp_path / "branchy.yaml"


def test_the_refusal_names_the_field_and_the_pasted_line_builds(tmp_path: Path, ctxbuild) -> None:
    recipe = _tree(tmp_path)
    r = ctxbuild("build", str(recipe), "-o", str(tmp_path / "out"))
    assert r.code == 1, r.text
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED prepare/")]
    assert ("control flow is not supported on QNN: node 'by_mode' (If) (If 'by_mode' takes its branch from input "
            "mode: if the app always passes mode = 1, fix it with `input_values: {mode: 1}` in the recipe; prepare "
            "keeps that branch)") in line, line

    recipe.write_text(RECIPE + re.search(r"`(input_values: [^`]*)`", line)[1] + "\n")  # pasted as printed
    out = tmp_path / "fixed"
    r = ctxbuild("build", str(recipe), "-o", str(out))
    assert r.code == 0, r.text
    wrapper = onnx.load(str(out / "SM8650" / "branchy" / "branchy_ctx.onnx"), load_external_data=False)
    assert [i.name for i in wrapper.graph.input] == ["x"]
    result = json.loads((out / "SM8650" / "branchy" / "branchy_verify.json").read_text())
    # against the user's model as given, run with mode = 1 on the samples
    assert result["passed"] and result["reference"] == "original" and result["outputs"]["y"]["snr_db"] >= 30
    (prepare,) = [json.loads(p.read_text()) for p in (out / ".ctxbuild" / "records").glob("prepare.*.json")]
    assert prepare["inlined"] == ["by_mode", "by_width"]

    # a sample recorded with another value: one line naming it, the input and the recipe's value
    np.savez(tmp_path / "samples" / "s1.npz", x=np.zeros((1, 16), np.float32), mode=np.array(2, np.int64))
    r = ctxbuild("build", str(recipe), "-o", str(out))
    assert r.code == 1 and f"{tmp_path / 'samples' / 's1.npz'}: 'mode' is 2 in this sample, the recipe's " \
        "input_values fixes it to 1" in r.err, r.text


def test_recipe_errors_exit_2(tmp_path: Path, ctxbuild) -> None:
    recipe = _tree(tmp_path)
    n = RECIPE.count("\n") + 1
    recipe.write_text(RECIPE + "input_values: {mod: 1}\n")
    r = ctxbuild("plan", str(recipe))
    assert r.code == 2 and r.err.splitlines() == [
        f"ctxbuild: error: {recipe}:{n}: input_values: 'mod' is not an input of branchy.onnx (did you mean 'mode'?)"
    ], r.text
    for line, message in [
        ("input_values: {mode: 1.5}", f"{n}: input_values: 'mode': the input is int64, 1.5 is not a whole number"),
        ("input_values: {mode: [1, 2]}", f"{n}: input_values: 'mode': the input's shape is [], the value's is [2]"),
        ("inputs: {mode: []}\ninput_values: {mode: 1}", f"{n + 1}: input_values: 'mode' is also in inputs"),
    ]:
        recipe.write_text(RECIPE + line + "\n")
        with pytest.raises(RecipeError) as e:
            recipe_set.load([recipe])
        assert e.value.message.startswith(f"{recipe}:{message}"), e.value.message
    # `outputs:` may name a tensor of the branch the values take (the hints print such names), only then
    recipe.write_text(RECIPE + "input_values: {mode: 1}\noutputs: [h1]\n")
    assert recipe_set.load([recipe]).recipes[0].graphs[0].outputs == ("h1",)
    recipe.write_text(RECIPE + "outputs: [h1]\n")
    with pytest.raises(RecipeError, match="outputs: 'h1' is not a tensor of branchy.onnx"):
        recipe_set.load([recipe])


def test_the_values_are_in_the_keys(tmp_path: Path) -> None:
    """No `input_values:`: no param (the keys stay as they were); each value: its own prepare and reference."""
    recipe = _tree(tmp_path)
    plans = {}
    for line in ("", "input_values: {mode: 1}\n", "input_values: {mode: 0}\n"):
        recipe.write_text(RECIPE + line)
        plans[line] = {a.kind: a for a in make_plan(recipe_set.load([recipe]), tmp_path / "out").actions}
    assert "input_values" not in plans[""]["prepare"].params and "input_values" not in plans[""]["verify"].params
    assert plans["input_values: {mode: 0}\n"]["verify"].params["input_values"] == {"mode": 0}
    assert len({p["prepare"].id for p in plans.values()}) == 3


def test_each_value_keeps_its_branch() -> None:
    """The inlined model computes what the user's model computes with the input set, for either branch."""
    x = np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32)
    user = ort.InferenceSession(branchy_model().SerializeToString(), providers=["CPUExecutionProvider"])
    for mode in (1, 0):
        model = branchy_model()
        apply(model, {"mode": mode})
        assert not [n for n in model.graph.node if n.op_type == "If"]
        onnx.checker.check_model(model, full_check=True)
        got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_array_equal(got[0], user.run(None, {"x": x, "mode": np.array(mode, np.int64)})[0])


def test_an_if_on_a_dimension_the_recipe_fixes_is_inlined_without_values() -> None:
    """An exporter's test of a dimension (torch's squeeze of a dynamic dim): decided once the recipe fixes the
    shape, inlined by prepare with no `input_values:`; left while the dim is open."""
    model = branchy_model()
    then = next(a.g for a in model.graph.node[1].attribute if a.name == "then_branch")
    g = helper.make_graph(list(then.node), "by_width", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
                          [helper.make_tensor_value_info("act", TensorProto.FLOAT, [1, 16])],
                          [model.graph.initializer[0], *then.initializer])
    open_dim = helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION)
    assert inline_decided(open_dim) == [] and [n.op_type for n in open_dim.graph.node][-1] == "If"
    open_dim.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 16  # as prepare fixes `inputs:`
    assert inline_decided(open_dim) == ["by_width"]
    assert [n.name for n in open_dim.graph.node][-1] == "relu" and "act" in open_dim.graph.node[-1].output
