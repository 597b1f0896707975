"""What a user bringing their own small ONNX model meets with the newest features: `verify --layers` on a
`precision: auto` recipe, a recipe's `outputs:` naming a tensor and the Relu after it, a tensor no input reaches,
quantization.nodes naming a node the cut left out. Real quantizer, QNN compiles and simulator runs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.graph.cut import split_line
from tests._qnn_models import IR_VERSION, OPSET, conv_model, conv_sigmoid_conv, matmul_nonzero_model
from tests.conftest import keep_only, records

CONV = "model: conv.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\n"


def _tree(d: Path, model: onnx.ModelProto, name: str, recipe: str) -> Path:
    """`name`.onnx, 4 calibration samples for it, and `name`.yaml holding `recipe`."""
    onnx.save(model, d / f"{name}.onnx")
    (d / "cal").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(4):
        np.savez(d / "cal" / f"s{i}.npz", **{v.name: rng.standard_normal(
            [x.dim_value for x in v.type.tensor_type.shape.dim]).astype(np.float32) for v in model.graph.input})
    (d / f"{name}.yaml").write_text(recipe)
    return d / f"{name}.yaml"


def test_layers_on_a_precision_search_diagnoses_the_candidate_it_ships_or_the_closest(tmp_path: Path,
                                                                                      ctxbuild) -> None:
    """`verify --layers` on a `precision: auto` recipe diagnoses the candidate the search ships (it crashed on the
    candidates' verifies, which hold no thresholds); when no candidate passes and none was compiled (every one
    rejected by the CPU screen), the CPU half of the diagnosis runs on the closest one. The result is written
    beside `<recipe>_search.json`."""
    recipe = _tree(tmp_path, conv_model(), "conv", CONV + "precision: auto\nquantization: [{}]\n"
                   "auto: {mixed: false, fp16: false}\n")
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "conv", str(recipe), "-o", str(out))
    assert r.code == 0, r.text
    d = json.loads((out / "SM8650" / "conv" / "conv_layers.json").read_text())
    assert (d["candidate"], d["graph"], d["target"]) == ("w8a16", "conv", "SM8650"), d
    assert d["outputs"]["features"]["htp"]["snr_db"] is not None and d["probe_runs"]  # the simulator's half ran
    assert "conv@SM8650: the search's answer, w8a16" in r.out, r.out
    report = json.loads((out / "report.json").read_text())
    (v,) = [v for row in report["rows"] for v in row["verify"] if v["id"] == "select/conv@SM8650"]
    assert v["layers"]["where"] == d["where"], v  # the report shows it, as for a graph without a search

    recipe.write_text(CONV + "precision: auto\nquantization: [{}]\nauto: {mixed: false, fp16: false}\n"
                      "verify: {min_snr_db: 90}\n")
    r = ctxbuild("verify", "--layers", "conv", str(recipe), "-o", str(out))
    assert r.code == 1 and "Traceback" not in r.err, r.text
    d = json.loads((out / "SM8650" / "conv" / "conv_layers.json").read_text())
    assert d["candidate"] == "w8a16" and d["where"] == "quantization" and not d["probe_runs"], d
    assert "conv@SM8650: no candidate passed; the closest on the CPU screen, w8a16 (not compiled: the CPU half" in r.out


def _relu_after_an_output() -> onnx.ModelProto:
    """matmul_nonzero_model with a Relu 'relu' between h and the Add: x -> MatMul 'fc' -> h -> Relu -> r, h also feeds
    NonZero (the part QNN cannot run), whose count is added to r: y. The static part before NonZero computes h
    and r, both read after it."""
    m = matmul_nonzero_model()
    add = next(n for n in m.graph.node if n.name == "add")
    add.input[0] = "r"
    m.graph.node.insert(1, helper.make_node("Relu", ["h"], ["r"], name="relu"))
    return m


def test_a_cut_at_a_tensor_and_the_relu_after_it_keeps_the_tensors_negative_values(tmp_path: Path,
                                                                                   ctxbuild) -> None:
    """`outputs: [h, r]` (what the hint names for this model) makes h a graph output whose only consumer is a Relu:
    onnxruntime's quantizer then gives h the Relu's range (adjust_tensor_ranges: a Relu's input takes its output's
    range when the Relu reads it alone), so h's negative values clamp to 0 (cosine 0.65 against h, on the CPU
    and the HTP alike). quantize keeps h's own range: the build verifies."""
    recipe = _tree(tmp_path, _relu_after_an_output(), "relu_nz",
                   "model: relu_nz.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\nprecision: w8a16\n")
    r = ctxbuild("plan", str(recipe))
    assert r.code == 0, r.text
    assert "`outputs: [h, r]`" in split_line(onnx.load(str(tmp_path / "relu_nz.onnx")))
    recipe.write_text(recipe.read_text() + "outputs: [h, r]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(recipe), "-o", str(out))
    assert r.code == 0, r.text
    result = json.loads((out / "SM8650" / "relu_nz" / "relu_nz_verify.json").read_text())
    assert result["passed"] and result["outputs"]["h"]["cosine"] > 0.999, result


def test_outputs_that_no_input_reaches_are_the_recipes_mistake(tmp_path: Path, ctxbuild) -> None:
    """`outputs:` naming only tensors computed from constants (a Constant node and what follows it): prepare folds
    the cut into constants and nothing is left to compile. It said "QNN took none of the model's nodes ... export the
    model with ops the HTP runs", exit 1; it is the recipe's mistake, exit 2, naming the tensor."""
    k = numpy_helper.from_array(np.full((1, 16), 0.5, np.float32), "kv")
    nodes = [helper.make_node("Constant", [], ["k"], name="kconst", value=k),
             helper.make_node("Relu", ["k"], ["k2"], name="krelu"),
             helper.make_node("Add", ["x", "k2"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    recipe = _tree(tmp_path, helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION), "konst",
                   "model: konst.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\nprecision: w8a16\n"
                   "outputs: [k2]\n")
    r = ctxbuild("build", str(recipe), "-o", str(tmp_path / "out"))
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED ")]
    assert r.code == 2 and ("outputs: 'k2' does not depend on the model's inputs (computed from constants alone): "
                            "nothing is left to compile") in line, r.text


def test_a_pin_on_a_node_past_the_cut_says_so(tmp_path: Path, ctxbuild) -> None:
    """quantization.nodes or .tensors naming what the recipe's `outputs:` cut off (the Relu after h, its output r):
    exit 2, and the line says the cut left it out. It said "'relu' is not a node of the model (use the node names
    Netron shows ...)", which Netron contradicts."""
    head = "model: relu_nz.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\nprecision: w8a16\noutputs: [h]\n"
    recipe = _tree(tmp_path, _relu_after_an_output(), "relu_nz", head)
    for pins, said in [("nodes: {relu: fp16}", "quantization.nodes: 'relu' is not a node of the model as "
                                               "`outputs: [h]` cuts it (what lies past the cut is not built)"),
                       ("tensors: {r: {type: uint16}}", "quantization.tensors: 'r' is not a tensor of the model as "
                                                        "`outputs: [h]` cuts it")]:
        recipe.write_text(head + f"quantization: {{{pins}}}\n")
        r = ctxbuild("build", str(recipe), "-o", str(tmp_path / "out"))
        (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED ")]
        assert r.code == 2 and said in line, r.text


def test_ninja_killed_mid_build_then_a_rebuild(tmp_path: Path, cache_dir: Path, ctxbuild) -> None:
    """ninja killed once an action finished (as a user's `kill` or the OOM killer may): the build exits 1 saying ninja
    stopped, not "ninja failed before running an action" (it had run some); nothing unverified ships, and the
    rebuild goes on from there and verifies."""
    recipe = _tree(tmp_path, conv_model(), "conv", CONV + "precision: w8a16\n")
    out = tmp_path / "out"
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache_dir)}
    env.pop("MAKEFLAGS", None)
    driver = subprocess.Popen([sys.executable, "-m", "ctxbuild", "build", str(recipe), "-o", str(out)], env=env,
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((out / ".ctxbuild" / "records").glob("prepare.*.json")):
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.02)
        (ninja,) = [int(p) for p in subprocess.run(["pgrep", "-P", str(driver.pid), "ninja"], capture_output=True,
                                                    text=True).stdout.split()]
        os.kill(ninja, signal.SIGTERM)
        _, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 1 and "ninja failed before running an action" not in stderr, stderr
    assert "ctxbuild: ninja stopped after" in stderr, stderr
    assert not (out / "SM8650" / "conv" / "conv_ctx.onnx").exists()  # nothing unverified in the deliverable tree
    assert json.loads((out / "report.json").read_text())["build"]["note"].startswith("ninja stopped after")

    r = ctxbuild("build", str(recipe), "-o", str(out))
    assert r.code == 0, r.text
    assert records(out)["verify/conv@SM8650"]["result"]["passed"] is True


@pytest.mark.parametrize("precision, idle, working, said", [
    # {s: fp16} on a weightless node whose neighbours are quantized: the quantizer still quantizes its input and
    # output (measured: the same binary; DequantizeLinear -> Sigmoid -> QuantizeLinear, one quantized op for QNN);
    # pinned with its neighbour the tensor between them stays float
    ("int8", "{s: fp16}", "{s: fp16, c2: fp16}",
     "quantization.nodes: s: fp16 changes nothing here: the nodes around it are quantized, so its inputs and outputs "
     "are too and QNN runs it as a quantized op; pin it together with a neighbour"),
    # {s: {weights: int16}}: the Sigmoid has no weights (checked: the same QDQ nodes and initializers); the Conv has
    ("int16", "{s: {weights: int16}}", "{c2: {weights: int16}}",
     "quantization.nodes: s: {weights: int16} changes nothing here: s has no weights (set activations for its "
     "output, or pin a node with weights)"),
])
def test_a_pin_that_changes_nothing_says_so(tmp_path: Path, ctxbuild, precision: str, idle: str, working: str,
                                            said: str) -> None:
    """A pin whose QDQ model is the unpinned one to the byte did nothing, silently: it warns, naming the node and
    what to do; a pin that changes the model does not."""
    head = f"model: csc.onnx\ncalibration: {{dir: cal}}\ntargets: [SM8650]\nprecision: {precision}\nverify: false\n"
    recipe = _tree(tmp_path, conv_sigmoid_conv(), "csc", head)
    for pins in (idle, working):
        recipe.write_text(head + f"quantization: {{nodes: {pins}}}\n")
        r = ctxbuild("build", str(recipe), "-o", str(tmp_path / "out"))
        assert r.code == 0, r.text
        assert (said in r.text) == (pins == idle), r.text


def test_layers_on_a_lora_recipe_feeds_the_slots_their_defaults(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """`verify --layers` on a recipe with LoRA adapters crashed with a traceback, exit 1 ("Required inputs
    (['layer1.lora_A', ...]) are missing from input feed (['x'])"): the QDQ model takes the slots as inputs, the
    samples hold the model's own inputs only. The diagnosis feeds each slot its default (the base without an
    adapter, as the base's verification runs it)."""
    keep_only(tree, "lora_mlp.yaml")
    (tree / "lora_mlp.yaml").write_text((tree / "lora_mlp.yaml").read_text().replace(
        "precision: w8a16\n", "precision: w8a16\ntargets: [SM8650]\n"))
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "lora_mlp", str(tree), "-o", str(out))
    assert r.code == 0 and "Traceback" not in r.err, r.text
    d = json.loads((out / "SM8650" / "lora_mlp" / "lora_mlp_layers.json").read_text())
    assert d["samples"] >= 1 and d["outputs"] and d["worst_quantization"], d


def test_a_16_bit_weights_pin_on_an_arch_without_them_is_the_recipes_mistake(tmp_path: Path, ctxbuild) -> None:
    """quantization.nodes {c: {weights: int16}} (the Conv, by its output) for SM8350 (v68): the uniform `weights: int16` is refused when
    planning (v73 or newer), the per-node pin was not: the compile failed, exit 1, saying "QNN cannot run 1 node(s):
    c (Conv) (set compile.cpu_fallback: true ...)". Now it is refused when planning, exit 2, naming the node."""
    recipe = _tree(tmp_path, conv_model(), "conv", "model: conv.onnx\ncalibration: {dir: cal}\ntargets: [SM8350]\n"
                   "precision: w8a16\nquantization: {nodes: {c: {weights: int16}}}\n")
    r = ctxbuild("plan", str(recipe))
    assert r.code == 2 and "node 'c': int16 weights need HTP v73 or newer; target SM8350 is v68" in r.err, r.text


def _select(recipe: str, target: str, nodes: dict[str, str]) -> dict[str, object]:
    """A select record whose search's mixed answer keeps `nodes`."""
    import yaml

    pin = yaml.safe_dump({"precision": "auto", "quantization": [{"nodes": nodes}],
                          "auto": {"mixed": False, "fp16": False}}, sort_keys=False)
    return {"id": f"select/{recipe}@{target}", "kind": "select",
            "search": {"winner": "mixed", "pin": pin,
                       "candidates": [{"name": "mixed", "precision": "mixed", "blamed": sorted(nodes)}]}}


def test_a_searchs_answer_is_printed_once_for_the_targets_it_pins_and_different_answers_say_so() -> None:
    """Two targets, one answer: the recipe lines were printed twice, once per target (a user pastes one block for
    every target of the recipe). Now once, naming both. Two answers: each, and a line saying the recipe's
    quantization applies to all its targets."""
    from ctxbuild.outputs.summary import pins

    same = pins([_select("det", "SM8650", {"head": "fp16"}), _select("det", "SM8750", {"head": "fp16"})])
    assert [ln for ln in same if not ln.startswith("    ")] == [
        "ctxbuild: det@SM8650, SM8750: the search's answer keeps head at higher precision; to pin it, put in the "
        "recipe:"], same
    apart = pins([_select("det", "SM8650", {"head": "fp16"}), _select("det", "SM8750", {"neck": "fp16"})])
    assert [ln for ln in apart if not ln.startswith("    ")] == [
        "ctxbuild: det@SM8650: the search's answer keeps head at higher precision; to pin it, put in the recipe:",
        "ctxbuild: det@SM8750: the search's answer keeps neck at higher precision; to pin it, put in the recipe:",
        "ctxbuild: det: the targets' answers differ and a recipe's quantization applies to every target: pin each "
        "in a recipe of its own (targets: [SM8650] and targets: [SM8750])"], apart


def test_the_json_document_carries_the_searchs_answers(tmp_path: Path) -> None:
    """`build --json` had no pin lines (the console's answer to paste): `pins` holds them, one entry per answer."""
    from ctxbuild.outputs.summary import document

    records = [_select("det", "SM8650", {"head": "fp16"}), _select("det", "SM8750", {"head": "fp16"}),
               _select("cls", "SM8650", {"fc": "fp16"})]
    doc = document(tmp_path, 0, searched=records)
    assert [(p["recipe"], p["targets"], p["nodes"]) for p in doc["pins"]] == [
        ("cls", ["SM8650"], ["fc"]), ("det", ["SM8650", "SM8750"], ["head"])], doc["pins"]
    assert doc["pins"][0]["pin"] == records[2]["search"]["pin"] and document(tmp_path, 0)["pins"] == []


def test_a_16_bit_weight_tensor_under_8_bit_activations_is_the_recipes_mistake(tmp_path: Path, ctxbuild) -> None:
    """quantization.tensors {w: {type: int16}} at int8: the rule the uniform and per-node settings are refused by
    (int16 weights need uint16 activations) held not for a weight tensor: the compile failed, exit 1, with "QNN
    cannot run 1 node(s): fc (MatMul) (set compile.cpu_fallback: true ...)". Now exit 2 naming the tensor."""
    recipe = _tree(tmp_path, _relu_after_an_output(), "relu_nz", "model: relu_nz.onnx\ncalibration: {dir: cal}\n"
                   "targets: [SM8650]\nprecision: w8a8\noutputs: [r]\nquantization: {tensors: {w: {type: int16}}}\n")
    r = ctxbuild("build", str(recipe), "-o", str(tmp_path / "out"))
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED ")]
    assert r.code == 2 and ("quantization.tensors: 'w': int16 weights need uint16 activations (fc computes 8-bit "
                            "activations)") in line, r.text
