"""Outputs whose parts live on different scales: per-slice verification and compile.split_outputs."""
from __future__ import annotations

import json
from pathlib import Path

import onnx

from tests._sliced_model import BOXES, CELLS, SCORES, write_tree
from tests.conftest import records


def test_weak_slice_fails_and_split_recovers_it(tmp_path: Path, ctxbuild) -> None:
    tree = write_tree(tmp_path / "recipes", {"det": "", "det_split": "compile: {split_outputs: true}\n"})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "-k", "0")
    assert r.code == 1, r.text
    recs = records(out)

    # One uint8 scale over boxes (0-320) and scores (0-1): the whole output passes, the score slice does not.
    plain = recs["verify/det@SM8650"]["result"]["outputs"]["detections"]
    assert plain["snr_db"] >= 12 and plain["cosine"] >= 0.95
    boxes, scores = plain["slices"]
    assert (boxes["slice"], boxes["start"], boxes["stop"]) == ("boxes_flat", 0, BOXES)
    assert (scores["slice"], scores["start"], scores["stop"]) == ("scores_flat", BOXES, BOXES + SCORES)
    assert boxes["range"] / scores["range"] > 100 and scores["snr_db"] < 12 and boxes["snr_db"] > 30
    line = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED verify/det@SM8650"))
    assert "slice 4:10 (scores_flat" in line and "compile.split_outputs: true" in line

    # Cut off, each part has its own scale: the slice recovers, callers see the original output.
    split = recs["verify/det_split@SM8650"]["result"]
    assert split["passed"] is True
    assert split["outputs"]["detections"]["slices"][1]["snr_db"] > scores["snr_db"] + 30
    wrapper = onnx.load(str(out / "SM8650" / "det_split" / "det_split_ctx.onnx"), load_external_data=False)
    assert [(o.name, [d.dim_value for d in o.type.tensor_type.shape.dim]) for o in wrapper.graph.output] == [
        ("detections", [1, BOXES + SCORES, CELLS])]
    assert [n.op_type for n in wrapper.graph.node] == ["EPContext", "Concat"]
    r = ctxbuild("inspect", str(out / "SM8650" / "det_split" / "det_split_ctx_qnn.bin"), "--json")
    graph = json.loads(r.out)["binaries"][0]["graphs"][0]
    # inside the binary: the two parts are separate outputs
    assert [(o["name"], o["dims"]) for o in graph["outputs"]] == [
        ("boxes_flat_DequantizeLinear_Output", [1, BOXES, CELLS]), ("scores_flat_DequantizeLinear_Output", [1, SCORES, CELLS])]
    assert split["coverage"]["cpu_nodes"] == 1  # the re-joining Concat


def test_declared_slices_and_bad_split_name(tmp_path: Path, ctxbuild) -> None:
    tree = write_tree(tmp_path / "recipes", {
        "declared": "compile: {split_outputs: true}\nverify: {slices: {detections: {axis: 1, sizes: [2, 2, 6]}}}\n",
        "wrong": "compile: {split_outputs: [logits]}\n"})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "-k", "0")
    assert r.code == 1, r.text
    recs = records(out)
    # the recipe's slices are reported even where ranges are alike (0:2 and 2:4 are both boxes)
    sl = recs["verify/declared@SM8650"]["result"]["outputs"]["detections"]["slices"]
    assert [(s["slice"], s["start"], s["stop"]) for s in sl] == [("0:2", 0, 2), ("2:4", 2, 4), ("4:10", 4, 10)]
    assert recs["compile/wrong@SM8650"]["status"] == "failed"
    assert "compile.split_outputs names logits, which no final Concat produces" in recs["compile/wrong@SM8650"]["cause"]
    assert "detections" in recs["compile/wrong@SM8650"]["cause"]


def test_split_outputs_in_a_bundle_is_refused(tmp_path: Path, ctxbuild) -> None:
    tree = write_tree(tmp_path / "recipes", {})
    (tree / "b.yaml").write_text("bundle:\n  - {name: a, model: det.onnx}\n  - {name: b, model: det.onnx}\n"
                                 "precision: w8a8\ncalibration: {dir: cal}\ntargets: [SM8650]\n"
                                 "compile:\n  split_outputs: true\n")
    r = ctxbuild("plan", str(tree))
    assert r.code == 2
    assert f"{tree / 'b.yaml'}:8: compile.split_outputs is not supported for bundles" in r.err


def test_split_outputs_with_external_data(tmp_path: Path, ctxbuild) -> None:
    """Weights big enough for external data (as every real detector's): the quantized model's .data file is
    staged for the EP, and the split re-reads the model with onnx, which refuses a hard-linked data file
    ('potential hardlink attack'). The compile must work, and a failure there must not be blamed on QNN."""
    tree = write_tree(tmp_path / "recipes", {"det_split": "compile: {split_outputs: true}\nverify: false\n"}, width=64)
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert (out / "SM8650" / "det_split" / "det_split_ctx_qnn.bin").stat().st_size > 0


def test_failed_verification_keeps_artifacts_out_of_the_deliverable_tree(tmp_path: Path, ctxbuild) -> None:
    """A graph that fails verification must not be shipped by a step that copies OUT/<target>/: its wrapper and
    binary move to OUT/.ctxbuild/failed/<target>/..., and the build says so."""
    tree = write_tree(tmp_path / "recipes", {"det": ""})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1, r.text
    assert not list((out / "SM8650").rglob("*.onnx")) and not list((out / "SM8650").rglob("*.bin")), r.text
    kept = out / ".ctxbuild" / "failed" / "SM8650" / "det"
    assert (kept / "det_ctx.onnx").is_file() and (kept / "det_ctx_qnn.bin").is_file()
    assert str(kept) in r.err, r.err


def test_split_outputs_with_nothing_to_split() -> None:
    """split_outputs: true on a model without a final Concat used to compile it unchanged, silently (a detector
    whose outputs are separate already); now the compile says so, naming the outputs and their last ops."""
    import pytest

    from ctxbuild.errors import ActionError
    from ctxbuild.qnn.split_outputs import cut
    from tests._qnn_models import conv_model

    model = conv_model()
    with pytest.raises(ActionError) as e:
        cut(model, None)
    out = model.graph.output[0].name
    assert str(e.value).startswith("compile.split_outputs: true, but no output is made by a final Concat: nothing "
                                   f"to split (outputs: '{out}' ({model.graph.node[-1].op_type}))"), e.value
    assert "remove compile.split_outputs" in e.value.hint
