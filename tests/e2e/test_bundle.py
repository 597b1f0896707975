"""Weight-shared bundles and multi-SoC binaries, built and read back with the real EP and libQnnSystem."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import keep_only, last_build, records
from tests._qnn_models import qnn_session


@pytest.fixture
def bundle_out(tree: Path, tmp_path: Path, ctxbuild) -> Path:
    keep_only(tree, "lm_bundle.yaml", "tiny_cnn_flex.yaml")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    return out


def _attr(model_path: Path, name: str) -> str:
    node = next(n for n in onnx.load(model_path, load_external_data=False).graph.node if n.op_type == "EPContext")
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name).decode()


def test_bundle_one_bin_per_target_named_by_both_graphs(bundle_out: Path) -> None:
    for target in ("SM8650", "SM8750"):
        d = bundle_out / target / "lm_bundle"
        assert sorted(p.name for p in d.glob("*.bin")) == ["lm_bundle_qnn.bin"]
        for graph in ("prefill", "decode"):
            assert _attr(d / f"{graph}_ctx.onnx", "ep_cache_context") == "lm_bundle_qnn.bin"
            # the wrapper keeps the model's own I/O names; the binary's names are mapped by the EP
            model = onnx.load(d / f"{graph}_ctx.onnx")
            assert [i.name for i in model.graph.input] == ["hidden"]
            assert f"hidden={graph}__hidden;" in _attr(d / f"{graph}_ctx.onnx", "io_name_overrides")


def test_bundle_stores_shared_weights_once(bundle_out: Path) -> None:
    manifest = json.loads((bundle_out / "manifest.json").read_text())
    bins = [a for a in manifest["artifacts"] if a["recipe"] == "lm_bundle" and a["kind"] == "context_binary"]
    assert len(bins) == 2
    for b in bins:
        ws = b["weight_sharing"]
        # the graphs built apart (verification twins, measured) vs together
        twins = sorted((bundle_out / ".ctxbuild" / "work" / "twins" / b["target"]["name"] / "lm_bundle").glob("*.bin"))
        assert len(twins) == 2 and ws["separate_bin_size"] == sum(p.stat().st_size for p in twins)
        assert ws["bundle_bin_size"] == b["size"]
        # ~1 MB of FFN weights in uint8 is stored once: the bundle is well under the two apart
        assert b["size"] < 0.6 * ws["separate_bin_size"], ws
        assert set(b["graphs"]) == {"prefill", "decode"}
        assert b["verification"] == {"status": "passed", "method": "single-graph build (bundle)"}
    # each graph was verified through its single-graph twin, and libQnnSystem confirmed the bundle holds a
    # graph with the same I/O signature
    for graph in ("prefill", "decode"):
        res = records(bundle_out)[f"verify/lm_bundle.{graph}@SM8650"]["result"]
        assert res["passed"] and res["bundle_signature_match"] is True


def test_inspect_lists_both_graphs_of_the_bundle(bundle_out: Path, ctxbuild) -> None:
    binf = bundle_out / "SM8650" / "lm_bundle" / "lm_bundle_qnn.bin"
    r = ctxbuild("inspect", str(binf), "--json")
    assert r.code == 0, r.text
    info = json.loads(r.out)
    (b,) = info["binaries"]
    graphs = {g["name"]: g for g in b["graphs"]}
    manifest = json.loads((bundle_out / "manifest.json").read_text())
    names = next(a["graphs"] for a in manifest["artifacts"] if a["path"] == "SM8650/lm_bundle/lm_bundle_qnn.bin")
    assert set(graphs) == set(names.values())
    prefill = graphs[names["prefill"]]
    assert [(t["name"], t["dims"]) for t in prefill["inputs"]] == [("prefill__hidden", [1, 32, 256])]
    decode = graphs[names["decode"]]
    assert [(t["name"], t["dims"]) for t in decode["outputs"]] == [("decode__out", [1, 1, 256])]
    assert b["build_id"] == manifest["toolchain"]["qnn_sdk_build_id"]
    text = ctxbuild("inspect", str(bundle_out / "SM8650" / "lm_bundle" / "decode_ctx.onnx")).out
    assert "decode__hidden" in text and "prefill__hidden" in text  # followed the wrapper to the shared bin


def test_multi_soc_binary_serves_both_socs(bundle_out: Path, ctxbuild) -> None:
    d = bundle_out / "SC8380XP+SM8750" / "tiny_cnn_flex"
    assert _attr(d / "tiny_cnn_flex_ctx.onnx", "ep_cache_context") == "tiny_cnn_flex_ctx_qnn.bin"
    node = next(n for n in onnx.load(d / "tiny_cnn_flex_ctx.onnx").graph.node if n.op_type == "EPContext")
    assert next(helper.get_attribute_value(a) for a in node.attribute if a.name == "is_multi_soc_ep_context") == 1
    manifest = json.loads((bundle_out / "manifest.json").read_text())
    entry = next(a for a in manifest["artifacts"] if a["path"].endswith("tiny_cnn_flex_ctx_qnn.bin"))
    assert [s["soc_model"] for s in entry["serves"]] == ["60", "69"]
    assert entry["verification"]["method"] == "single-SoC build (SC8380XP)"
    info = json.loads(ctxbuild("inspect", str(d / "tiny_cnn_flex_ctx_qnn.bin"), "--json").out)
    socs = sorted((t["soc_model"], t["htp_arch"]) for b in info["binaries"] for t in b["targets"])
    assert socs == [(60, 73), (69, 79)]


def test_wrap_round_trips_a_ctxbuild_binary(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "tiny_cnn.yaml")
    out = tmp_path / "out"
    assert ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650").code == 0
    original = out / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx.onnx"
    for embed in (False, True):
        wrapped_dir = tmp_path / f"wrapped{int(embed)}"
        r = ctxbuild("wrap", str(original.with_name("tiny_cnn_ctx_qnn.bin")), "-o", str(wrapped_dir),
                     *(["--embed"] if embed else []))
        assert r.code == 0, r.text
        (wrapper,) = [Path(p) for p in r.out.split()]
        x = np.load(tree / "models" / "calib" / "tiny_cnn" / "sample_001.npz")["image"]
        want = qnn_session(original).run(None, {"image": x})[0]
        sess = qnn_session(wrapper)
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        np.testing.assert_array_equal(got, want)


# ---- constraints: errors at plan time (exit 2) ---------------------------------------------------------

BUNDLE = """bundle:
  - {name: prefill, model: models/lm_prefill.onnx, calibration: {dir: models/calib/lm_prefill}}
  - {name: NAME2, model: models/lm_decode.onnx, calibration: {dir: models/calib/lm_decode}}
precision: w8a16
targets: [SM8650]
"""


@pytest.mark.parametrize("body, expect", [
    (BUNDLE.replace("NAME2", "prefill"), "graph name 'prefill' appears twice in the bundle"),
    (BUNDLE.replace("NAME2", "decode") + "compile: {embed: true}\n", "a bundle cannot use compile.embed"),
    (BUNDLE.replace("NAME2", "decode").replace("targets: [SM8650]", "targets: [SM8650, SM8750]")
     + "multi_soc: true\n", "multi_soc cannot be combined with a bundle"),
    ("model: models/mlp.onnx\nprecision: fp16\ntargets: [SM8650, SM8750]\nmulti_soc: true\n"
     "compile: {embed: true}\n", "multi_soc cannot be combined with compile.embed"),
    ("model: models/mlp.onnx\nprecision: fp16\ntargets: [SM8650]\nmulti_soc: true\n", "needs two or more targets"),
])
def test_bundle_and_multi_soc_constraints(tree: Path, tmp_path: Path, ctxbuild, body: str, expect: str) -> None:
    keep_only(tree)
    (tree / "bad.yaml").write_text(body)
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2, r.text
    assert "bad.yaml:" in r.err and expect in r.err


def test_differently_quantized_shared_weight_is_caught(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """The same weight consumed as a MatMul weight in one graph and as an activation-like Add input in the
    other quantizes differently (uint8 weight vs uint16 activation): QNN would store it twice."""
    keep_only(tree)
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "shared_w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    for name, node in (("a", helper.make_node("MatMul", ["x", "shared_w"], ["y"])),
                       ("b", helper.make_node("Add", ["x", "shared_w"], ["y"]))):
        if name == "b":
            y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
        m = helper.make_model(helper.make_graph([node], name, [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
        onnx.save(m, tree / "models" / f"{name}.onnx")
    (tree / "pair.yaml").write_text(
        "bundle:\n  - {name: a, model: models/a.onnx}\n  - {name: b, model: models/b.onnx}\n"
        "precision: w8a16\ncalibration: {random: true, samples: 2}\ntargets: [SM8650]\nverify: false\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 1, r.text
    assert "share weight 'shared_w' but quantize it differently" in r.text
    assert "bundle/pair@SM8650" in last_build(tmp_path / "out")


def test_prebuilt_binary_flows_through_targets_cache_and_manifest(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """A binary made elsewhere (here: by an earlier ctxbuild build) named as a recipe's input."""
    keep_only(tree, "tiny_cnn.yaml")
    first = tmp_path / "first"
    assert ctxbuild("build", str(tree), "-o", str(first), "--target", "SM8650").code == 0
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "cnn.bin").write_bytes((first / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx_qnn.bin").read_bytes())
    (vendor / "cnn_vendor.yaml").write_text("prebuilt: {bin: cnn.bin}\ntargets: [SM8650]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(vendor), "-o", str(out))
    assert r.code == 0, r.text
    wrapper = out / "SM8650" / "cnn_vendor" / "cnn_vendor_ctx.onnx"
    x = np.load(tree / "models" / "calib" / "tiny_cnn" / "sample_002.npz")["image"]
    want = qnn_session(first / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx.onnx").run(None, {"image": x})[0]
    sess = qnn_session(wrapper)
    np.testing.assert_array_equal(sess.run(None, {sess.get_inputs()[0].name: x})[0], want)
    manifest = json.loads((out / "manifest.json").read_text())
    assert {a["path"] for a in manifest["artifacts"]} == {"SM8650/cnn_vendor/cnn_vendor_ctx.onnx",
                                                         "SM8650/cnn_vendor/cnn_vendor_qnn.bin"}
    # cached like any action: a fresh OUT restores it
    r = ctxbuild("build", str(vendor), "-o", str(tmp_path / "out2"))
    assert r.code == 0 and last_build(tmp_path / "out2") == {"prebuilt/cnn_vendor@SM8650": "cache"}


@pytest.mark.parametrize("body, expect", [
    ("prebuilt: {bin: cnn.bin}\ntargets: [SM8750]\n", "built for soc_model 57 / HTP v75, target SM8750"),
    ("prebuilt: {bin: cnn.bin, graphs: [a, b]}\ntargets: [SM8650]\n", "holds 1 graph(s), the recipe names 2"),
])
def test_prebuilt_mismatches_are_clear(tree: Path, tmp_path: Path, ctxbuild, body: str, expect: str) -> None:
    keep_only(tree, "tiny_cnn.yaml")
    first = tmp_path / "first"
    assert ctxbuild("build", str(tree), "-o", str(first), "--target", "SM8650", "--no-verify").code == 0
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "cnn.bin").write_bytes((first / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx_qnn.bin").read_bytes())
    (vendor / "p.yaml").write_text(body)
    r = ctxbuild("build", str(vendor), "-o", str(tmp_path / "out"))
    assert r.code == 1 and expect in r.err, r.text
