"""The recipe's `input_values:`: an input the app always sets to one value becomes a constant, and the If it
decides keeps that branch (graph/inputvalues.py), so a model exported with a branch on a setting builds whole;
verified against the user's model run with that input set. Real QNN compile and simulator run of a MatMul model
whose `If(mode == 1)` chooses between two weights, with an If inside decided by the input's shape."""
from __future__ import annotations

import json
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
from tests._hints import build_pasted, failed_line, pasted
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
    line = failed_line(ctxbuild, recipe, tmp_path / "out", "prepare/")
    assert ("control flow is not supported on QNN: node 'by_mode' (If) (If 'by_mode' takes its branch from input "
            "mode: if the app always passes mode = 1, fix it with `input_values: {mode: 1}` in the recipe; prepare "
            "keeps that branch)") in line, line

    out = tmp_path / "fixed"
    wrapper, result = build_pasted(ctxbuild, recipe, RECIPE + pasted(line, "input_values") + "\n", out)
    assert [i.name for i in wrapper.graph.input] == ["x"]
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
        # a string or nothing: the schema's check crashed (a TypeError's traceback, exit 1)
        ('input_values: {mode: "1"}', f"{n}: input_values.mode: expected number or boolean or list, got str '1'"),
        ("input_values: {mode: }", f"{n}: input_values.mode: expected number or boolean or list, got NoneType None"),
        # YAML reads on/off/yes/no as booleans: not a number for an int64 input
        ("input_values: {mode: on}", f"{n}: input_values: 'mode': the input is int64, true is a boolean"),
        # every input fixed: prepare folded the model into constants and the compile blamed QNN's op support (exit 1)
        ("input_values: {mode: 1, x: [" + str([0.0] * 16) + "]}",
         f"{n}: input_values fixes every input of branchy.onnx (mode, x): the model computes a constant"),
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
    # a tensor of the branch the values drop: said so (it read "is not a tensor of branchy.onnx", which it is)
    recipe.write_text(RECIPE + "input_values: {mode: 0}\noutputs: [h1]\n")
    with pytest.raises(RecipeError) as e:
        recipe_set.load([recipe])
    assert e.value.message == (f"{recipe}:{n + 1}: outputs: 'h1' is computed in an If branch `input_values: {{mode: 0}}` "
                               "does not take (nothing of that branch is built)"), e.value.message


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


def _scaled_branchy(path: Path) -> None:
    """branchy_model with a float input `alpha` scaling its output (a LoRA-style scaling input)."""
    model = branchy_model()
    g = model.graph
    g.node[-1].output[0] = "y0"
    g.node.append(helper.make_node("Mul", ["y0", "alpha"], ["y"], name="scale"))
    g.input.append(helper.make_tensor_value_info("alpha", TensorProto.FLOAT, [1]))
    onnx.save(model, path)


def test_input_values_with_bundles_and_adapters_where_they_cannot_apply_exit_2(tmp_path: Path, ctxbuild) -> None:
    """A bundle's `input_values:` beside `bundle:` (not in a graph's entry) applied to no graph: the build failed in
    prepare with the hint to add the line the recipe already had. An input the values fix that LoRA adapters set
    (adapters.scaling, or a slot) was made an input again by the adapters, the recipe's value silently dropped.
    Both are refused when planning, exit 2, naming the field and where it goes."""
    recipe = _tree(tmp_path)
    bundle = ("bundle:\n  - {name: a, model: branchy.onnx}\n  - {name: b, model: branchy.onnx}\n"
              "precision: fp16\ntargets: [SM8650]\n")
    for field in ("input_values: {mode: 1}", "outputs: [y]", "inputs: {x: [1, 16]}"):
        recipe.write_text(bundle + field + "\n")
        key = field.split(":")[0]
        with pytest.raises(RecipeError) as e:
            recipe_set.load([recipe])
        assert (e.value.message, e.value.hint) == (
            f"{recipe}:6: {key}: a bundle's graphs set their own {key} (it applies to none here)",
            f"move it into each graph's entry, e.g. `- {{name: a, model: branchy.onnx, {field}}}`")
    r = ctxbuild("plan", str(recipe))
    assert r.code == 2 and len(r.err.splitlines()) == 1 and e.value.hint in r.err, r.text
    recipe.write_text(bundle.replace("{name: b,", "{name: off,"))  # YAML 1.1: a boolean
    with pytest.raises(RecipeError) as e:
        recipe_set.load([recipe])
    assert (e.value.message, e.value.hint) == (f"{recipe}:3: bundle.1.name: expected string, got bool False",
                                               "quote it, e.g. 'on': YAML reads on/off/yes/no/true/false unquoted as a boolean")
    recipe.write_text(bundle.replace("branchy.onnx}", "branchy.onnx, input_values: {mode: 1}}"))
    assert [g.input_values for g in recipe_set.load([recipe]).recipes[0].graphs] == [{"mode": 1}, {"mode": 1}]

    _scaled_branchy(tmp_path / "branchy.onnx")
    (tmp_path / "a.safetensors").write_bytes(b"")  # not read when planning
    adapters = "adapters:\n  slots: ['w*', {slot}]\n  scaling: alpha\n  files: [{{name: a, file: a.safetensors}}]\n"
    for values, slot, said in (
            ("{mode: 1, alpha: [0.5]}", "w1", "'alpha' is adapters.scaling: each adapter sets it (its `scale`)"),
            ("{mode: 1, alpha: [0.5]}", "alph*", "'alpha' is adapters.scaling: each adapter sets it (its `scale`)"),
            ("{mode: 1}", "mod*", "'mode' is an adapter slot (adapters.slots 'mod*'): each adapter sets it")):
        recipe.write_text(RECIPE.replace("fp16", "int16") + "calibration: {dir: samples}\n"
                          f"input_values: {values}\n" + adapters.format(slot=slot))
        with pytest.raises(RecipeError) as e:
            recipe_set.load([recipe])
        assert e.value.message == f"{recipe}:6: input_values: {said}", e.value.message


BUNDLE_LORA = """bundle:
  - {name: lora_on, model: lm.onnx, input_values: {mode: 1}}
  - {name: lora_off, model: lm.onnx, input_values: {mode: 0}}
precision: w8a16
calibration: {dir: cal}
targets: [SM8650]
adapters:
  slots: ["*lora_A", "*lora_B"]
  scaling: lora_scale
  files: [{name: formal, file: formal.npz, scale: 0.5}]
"""


def lora_branchy_tree(root: Path, extra: str = "") -> Path:
    """The example LoRA MLP with its second layer's LoRA inside `If(mode == 1)` (else the base alone), an
    adapter (at scale 0.5), calibration, and a bundle recipe (BUNDLE_LORA + `extra`) building it with mode 1 and mode 0: the
    second graph reads no layer-2 slot."""
    import importlib.util

    from tests.conftest import RECIPES

    spec = importlib.util.spec_from_file_location("make_models", RECIPES / "models" / "make_models.py")
    make_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_models)
    model = make_models.lora_mlp(np.random.default_rng(12))
    g = model.graph
    tail = [n for n in g.node if n.name.startswith("lora2_")]
    head = [n for n in g.node if not n.name.startswith("lora2_")]
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 16, 64])  # noqa: E731
    then = helper.make_graph(tail, "with_lora", [], [out("y")])
    other = helper.make_graph([helper.make_node("Identity", ["base2"], ["yb"], name="no_lora")], "base", [], [out("yb")])
    del g.node[:]
    g.node.extend(head + [helper.make_node("Equal", ["mode", "one"], ["is_one"], name="is_one"),
                          helper.make_node("If", ["is_one"], ["out"], name="by_mode", then_branch=then,
                                           else_branch=other)])
    g.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "one"))
    g.input.append(helper.make_tensor_value_info("mode", TensorProto.INT64, []))
    g.output[0].name = "out"
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(model, root / "lm.onnx")
    rng = np.random.default_rng(3)
    (root / "cal").mkdir()
    for i in range(3):
        np.savez(root / "cal" / f"s{i}.npz", x=rng.standard_normal((1, 16, 64)).astype(np.float32))
    np.savez(root / "formal.npz", **make_models.lora_weights(rng))
    (root / "lm.yaml").write_text(BUNDLE_LORA + extra)
    return root / "lm.yaml"


def test_a_bundle_of_lora_graphs_with_their_own_input_values_builds_and_verifies(tmp_path: Path, ctxbuild) -> None:
    """Two graphs of one model, `input_values: {mode: 1}` and `{mode: 0}`, sharing weights and LoRA slots: the
    second takes the branch without layer 2's LoRA, so its slots there are read by no node. The bundle refused it
    ("share weight 'layer2.lora_A' but quantize it differently": the graph that does not read it has no
    quantization of it); now each graph and each adapter verifies against the user's model run with its mode."""
    recipe = lora_branchy_tree(tmp_path)
    out = tmp_path / "out"
    r = ctxbuild("build", str(recipe), "-o", str(out))
    assert r.code == 0, r.text
    results = [f"{g}_verify.json" for g in ("lora_on", "lora_off")] + [
        f"adapters/{g}.formal_verify.json" for g in ("lora_on", "lora_off")]
    for name in results:
        result = json.loads((out / "SM8650" / "lm" / name).read_text())
        assert result["passed"] and result["outputs"]["out"]["snr_db"] > 30, (name, result)


def test_a_pin_in_the_branch_the_values_drop_says_so(tmp_path: Path, ctxbuild) -> None:
    """quantization.nodes naming a node of the If branch `input_values:` does not take said "'fc2' is not a node
    of the model (did you mean 'fc1'?)": it is one, in the branch prepare dropped. Now the line says so, exit 2."""
    recipe = _tree(tmp_path)
    recipe.write_text(RECIPE.replace("fp16", "int16") + "calibration: {dir: samples}\ninput_values: {mode: 1}\n"
                      "quantization: {nodes: {fc2: fp16}}\n")
    r = ctxbuild("build", str(recipe), "-o", str(tmp_path / "out"))
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED ")]
    assert r.code == 2 and ("quantization.nodes: 'fc2' is not a node of the model as `input_values: {mode: 1}` "
                            "makes it (an If branch the values do not take is not built)") in line, r.text


def test_a_default_input_values_a_model_lacks_names_the_defaults_file(tmp_path: Path) -> None:
    """`input_values:` in a directory's _defaults.yaml, and a recipe there whose model lacks the input: the error
    named the recipe's line 1, which holds no input_values. It says where the field came from."""
    (tmp_path / "sub").mkdir()
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]), opset_imports=OPSET, ir_version=IR_VERSION),
        tmp_path / "sub" / "relu.onnx")
    (tmp_path / "_defaults.yaml").write_text("defaults:\n  input_values: {mode: 1}\n")
    (tmp_path / "sub" / "relu.yaml").write_text("model: relu.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    with pytest.raises(RecipeError) as e:
        recipe_set.load([tmp_path])
    assert e.value.message == (f"{tmp_path / 'sub' / 'relu.yaml'}:1 (input_values from the directory defaults, "
                               "_defaults.yaml): input_values: 'mode' is not an input of relu.onnx"), e.value.message


def test_a_default_input_values_applies_to_a_bundles_graphs(tmp_path: Path) -> None:
    """`input_values: {mode: 1}` in a directory's _defaults.yaml reached a single-model recipe but not the graphs
    of a bundle there: they were planned with `mode` an input, and prepare refused the If it decides. Defaults
    apply wherever they can: each graph gets it, a graph's own entry wins key by key, and a graph whose model
    lacks the input names the defaults file."""
    _tree(tmp_path)
    (tmp_path / "_defaults.yaml").write_text("defaults:\n  input_values: {mode: 1}\n")
    (tmp_path / "branchy.yaml").write_text(
        "bundle:\n  - {name: one, model: branchy.onnx}\n  - {name: zero, model: branchy.onnx, input_values: {mode: 0}}\n"
        "precision: fp16\ntargets: [SM8650]\nverify: {dir: samples}\n")
    (recipe,) = recipe_set.load([tmp_path]).recipes
    assert {g.name: g.input_values for g in recipe.graphs} == {"one": {"mode": 1}, "zero": {"mode": 0}}
    prepares = [a for a in make_plan(recipe_set.load([tmp_path]), tmp_path / "out").actions if a.kind == "prepare"]
    assert sorted(a.params["input_values"]["mode"] for a in prepares) == [0, 1], [a.params for a in prepares]

    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])]), opset_imports=OPSET, ir_version=IR_VERSION),
        tmp_path / "relu.onnx")
    (tmp_path / "branchy.yaml").write_text("bundle:\n  - {name: one, model: branchy.onnx}\n  - {name: r, model: relu.onnx}\n"
                                           "precision: fp16\ntargets: [SM8650]\n")
    with pytest.raises(RecipeError) as e:
        recipe_set.load([tmp_path])
    assert e.value.message == (f"{tmp_path / 'branchy.yaml'}:3 (input_values from the directory defaults, "
                               "_defaults.yaml): input_values: 'mode' is not an input of relu.onnx"), e.value.message
