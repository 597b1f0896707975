"""Weights the local cache shares with OUT by hard link (issue 29, "OUT + cache <= 3x the model"): onnx's loader
refuses a `.data` file with several links, so ctxbuild reads external data itself (graph/external_data.py) and gives
onnxruntime's quantizer private copies. A `.data` file stored and restored by link is read, quantized and run as a
copy is, and the shared inode is never written; an LLM recipe built with every weight file linked gives the bytes a
copying build gives."""
from __future__ import annotations

import hashlib
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.actions.quantize import private_input, quantize_model
from ctxbuild.cache import LocalStore
from ctxbuild.cache.files import LINK_MIN_BYTES
from ctxbuild.errors import ActionError
from ctxbuild.graph.external_data import onnx_readable, tensor_array
from ctxbuild.graph.modelio import data_path, load
from ctxbuild.recipes.quantization import settings as quantization
from tests.conftest import RECIPES, keep_only, last_build
from tests.e2e.test_cache_build import build, digests

KEY = hashlib.sha256(b"weights").hexdigest()


def mlp(path: Path) -> np.ndarray:
    """A 64 -> 256 -> 64 MLP with its weights (~130 KB) in `<path>.data`, as ctxbuild writes its models."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((64, 256), np.float32) * 0.1, rng.standard_normal((256, 64), np.float32) * 0.1
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path), save_as_external_data=True, location=data_path(path).name, size_threshold=0)
    return w1


def linked_model(tmp_path: Path) -> tuple[Path, LocalStore]:
    """The MLP built in one OUT, stored by link, restored by link into another: its `.data` has 3 links."""
    built, restored = tmp_path / "out1" / "m.onnx", tmp_path / "out2" / "m.onnx"
    built.parent.mkdir(parents=True)
    mlp(built)
    store = LocalStore(tmp_path / "cache", link_min=LINK_MIN_BYTES)
    record = store.put(KEY, {"model": built, "model.data": data_path(built)}, None, {})
    assert store.restore(record, {"model": restored, "model.data": data_path(restored)})
    return restored, store


def test_a_linked_data_file_is_what_onnx_refuses_and_ctxbuild_reads(tmp_path: Path) -> None:
    model, _ = linked_model(tmp_path)
    data = data_path(model)
    assert data.stat().st_nlink == 3 and stat.S_IMODE(data.stat().st_mode) == 0o444
    with pytest.raises(Exception, match="hard link"):  # why ctxbuild has its own reader
        onnx.load(str(model))
    loaded = load(model)
    assert not any(t.external_data for t in loaded.graph.initializer)
    w1 = mlp(tmp_path / "fresh.onnx")
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), w1)
    proto = load(model, external_data=False)
    np.testing.assert_array_equal(tensor_array(proto.graph.initializer[0], model), w1)


def test_onnxruntime_runs_a_linked_data_file(tmp_path: Path) -> None:
    import onnxruntime as ort

    model, _ = linked_model(tmp_path)
    x = np.ones((1, 64), np.float32)
    got = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    fresh = tmp_path / "fresh.onnx"
    mlp(fresh)
    want = ort.InferenceSession(str(fresh), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_the_quantizer_reads_a_linked_data_file_through_private_copies(tmp_path: Path) -> None:
    """onnxruntime's quantizer on a restored (linked) model gives the bytes it gives on a plain copy; the private
    copy and proto are gone afterwards, and the shared inode was not written (the blob's seal still holds)."""
    model, store = linked_model(tmp_path)
    fresh = tmp_path / "fresh" / "m.onnx"
    fresh.parent.mkdir()
    mlp(fresh)
    settings = quantization({"activations": "uint8", "weights": "uint8"})
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 64)).astype(np.float32)} for i in range(4)]
    blob = data_path(model).stat()
    listing = sorted(p.name for p in model.parent.iterdir())
    outputs = {}
    for name, src in (("linked", model), ("fresh", fresh)):
        dst = tmp_path / f"q-{name}" / "q.onnx"
        dst.parent.mkdir()
        with private_input(src) as private:
            quantize_model(private, dst, settings, samples, "test.yaml")
        outputs[name] = dst.read_bytes(), data_path(dst).read_bytes()
    assert outputs["linked"] == outputs["fresh"]
    assert sorted(p.name for p in model.parent.iterdir()) == listing  # no private copy or proto left
    after = data_path(model).stat()  # the blob's inode: what its seal records did not move
    assert (after.st_ino, after.st_mtime_ns, after.st_nlink) == (blob.st_ino, blob.st_mtime_ns, blob.st_nlink)
    digest = hashlib.sha256(data_path(model).read_bytes()).hexdigest()
    assert store.blob_path(digest).stat().st_ino == after.st_ino


def test_onnx_readable_copies_only_linked_files(tmp_path: Path) -> None:
    """Without the cache's links (one link per file) the tools get a link to the proto and the data in place."""
    model = tmp_path / "m.onnx"
    mlp(model)
    with onnx_readable(model, ".private.onnx") as private:
        assert private.stat().st_ino == model.stat().st_ino
        assert sorted(p.name for p in tmp_path.iterdir()) == [".private.onnx", "m.onnx", "m.onnx.data"]
        onnx.load(str(private))
    linked, _ = linked_model(tmp_path / "l")
    with onnx_readable(linked, ".private.onnx") as private:
        copies = [p for p in linked.parent.iterdir() if ".private-" in p.name]
        assert len(copies) == 1 and copies[0].stat().st_nlink == 1
        onnx.load(str(private))  # onnx's own checked loader takes it
    assert not any(".private" in p.name for p in linked.parent.iterdir())


def test_a_range_past_the_end_of_the_data_file_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    mlp(model)
    proto = load(model, external_data=False)
    for e in proto.graph.initializer[0].external_data:
        if e.key == "length":
            e.value = str(10 << 20)
    onnx.save(proto, str(model))
    with pytest.raises(ActionError, match="past the end"):
        load(model)


def test_an_llm_built_on_linked_weights_equals_a_copying_build(tree: Path, tmp_path: Path, ctxbuild,
                                                               cache_dir: Path) -> None:
    """recipes/llm_tiny.yaml on one SoC with CTXBUILD_CACHE_LINK=1: every action after the split reads weight files
    the cache shares (the quantizer, the part checks' twins and simulator, genai, the bundles' compiles); the
    artifacts equal a build that copies (CTXBUILD_CACHE_LINK=0, its own cache), and a fresh OUT restored from the
    cache holds the same inodes, read-only."""
    (tree / "llm_tiny.yaml").write_text((RECIPES / "llm_tiny.yaml").read_text().replace("[phones]", "[SM8650]"))
    keep_only(tree, "llm_tiny.yaml")
    linked, copied, restored = tmp_path / "linked", tmp_path / "copied", tmp_path / "restored"
    build(ctxbuild, tree, linked, env={"CTXBUILD_CACHE_LINK": "1"})
    weights = sorted((linked / ".ctxbuild" / "work").rglob("*.data"))  # the split's and the quantizes' outputs
    assert weights and all(p.stat().st_nlink == 2 and not p.stat().st_mode & 0o222 for p in weights)
    build(ctxbuild, tree, copied, env={"CTXBUILD_CACHE_LINK": "0", "CTXBUILD_CACHE_DIR": str(tmp_path / "copies")})
    assert all(p.stat().st_nlink == 1 for p in copied.rglob("*.data"))
    assert digests(linked) == digests(copied)
    build(ctxbuild, tree, restored, env={"CTXBUILD_CACHE_LINK": "1"})
    assert set(last_build(restored).values()) == {"cache"}
    shared = [(p, restored / p.relative_to(linked)) for p in weights if (restored / p.relative_to(linked)).exists()]
    assert shared and all(a.stat().st_ino == b.stat().st_ino for a, b in shared)
    shutil.rmtree(cache_dir)  # the restored OUT's files keep their bytes without the cache
    assert digests(restored) == digests(linked)
