"""`inspect` against binaries compiled by the real onnxruntime-qnn toolchain (nothing mocked)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest

from ctxbuild.qnn.contextbin import describe, format_text, read_binary_info
from ctxbuild.errors import InspectError
from tests._qnn_models import Built, bin_of, build_models, conv_model

pytestmark = pytest.mark.e2e  # compiles with the real QNN EP in-process


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_models(tmp_path_factory.mktemp("models"))


def test_single_graph_bin(built: Built) -> None:
    info = describe(bin_of(built.conv_ctx))
    assert info["kind"] == "bin" and info["wrapper"] is None
    (b,) = info["binaries"]
    assert b["format"] == "context_binary" and b["backend"] == "HTP" and b["backend_id"] == 6
    assert b["build_id"].startswith("v2.") and b["file_size"] == bin_of(built.conv_ctx).stat().st_size
    (t,) = b["targets"]
    assert (t["soc_model"], t["soc_name"], t["htp_arch"]) == (57, "SM8650", 75)
    assert 0 < t["context_blob_size"] <= b["file_size"]
    (g,) = b["graphs"]
    # ctxbuild compiles without CPU fallback: the EP keeps graph-I/O Q/DQ inside the QNN graph.
    assert [(x["name"], x["dtype"], x["dims"], x["quantization"]) for x in g["inputs"]] == [
        ("image", "FLOAT_32", [1, 3, 16, 16], None)]
    assert [(x["name"], x["dims"]) for x in g["outputs"]] == [("features", [1, 8, 16, 16])]
    assert g["graph_blob"]["vtcm_bytes"] > 0 and g["graph_blob"]["spill_fill_buffer_size"] == 0
    text = format_text(info)
    for expected in ("SM8650", "HTP v75", b["build_id"], g["name"], "image", "1x3x16x16"):
        assert expected in text


def test_ctx_onnx(built: Built) -> None:
    info = describe(built.conv_ctx)
    w = info["wrapper"]
    (node,) = w["nodes"]
    assert node["attributes"]["ep_cache_context"] == bin_of(built.conv_ctx).name
    assert node["attributes"]["partition_name"] == info["binaries"][0]["graphs"][0]["name"]
    assert node["binary"] == info["binaries"][0]["source"] == str(bin_of(built.conv_ctx))
    assert w["inputs"] == [{"name": "image", "dtype": "float32", "shape": [1, 3, 16, 16]}]
    assert w["problems"] == []
    assert "EPContext model" in format_text(info)


def test_embedded_ctx_onnx(built: Built) -> None:
    info = describe(built.conv_embed_ctx)
    attrs = info["wrapper"]["nodes"][0]["attributes"]
    assert attrs["embed_mode"] == 1 and attrs["ep_cache_context"].endswith("bytes embedded>")
    assert info["binaries"][0]["source"].startswith("embedded in node")
    assert info["binaries"][0]["graphs"][0]["inputs"][0]["name"] == "image"


def test_quantized_graph_io_matches_the_onnx_qdq(built: Built) -> None:
    """With CPU fallback the QNN graph has UFIXED_POINT_16 I/O; its scale/offset must be the
    ONNX QuantizeLinear parameters the EP wrote around it, with zero_point = -offset."""
    info = describe(built.mm_ctx)
    g = info["binaries"][0]["graphs"][0]
    model = onnx.load(built.mm_ctx)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for tensor in g["inputs"] + g["outputs"]:
        q = tensor["quantization"]
        assert tensor["dtype"] == "UFIXED_POINT_16" and q["encoding"] == "SCALE_OFFSET"
        assert np.float32(q["scale"]) == inits[f"{tensor['name']}_scale"]
        assert -q["offset"] == inits[f"{tensor['name']}_zero_point"]
    assert "scale=" in format_text(info)


def test_weight_shared_two_graphs(built: Built) -> None:
    a, b = built.shared_ctxs
    shared_bin = bin_of(a)
    assert not bin_of(b).exists()  # both wrappers name the first model's bin
    info = describe(shared_bin)
    graphs = info["binaries"][0]["graphs"]
    assert len(graphs) == 2
    for g, rows in zip(graphs, (1, 4)):
        assert [(x["name"], x["dims"]) for x in g["inputs"]] == [("x", [rows, 64]), ("y", [rows, 32])]
        assert [x["name"] for x in g["outputs"]] == ["z", "aux"]
    # The weight is stored once and counted by both graphs.
    shared = [g["graph_blob"]["shared_weights_size"] for g in graphs]
    assert shared[0] == shared[1] > 0
    for ctx in (a, b):
        w = describe(ctx)
        assert w["wrapper"]["problems"] == [] and w["binaries"][0]["source"] == str(shared_bin)
    text = format_text(info)
    assert all(g["name"] in text for g in graphs)


def test_multi_soc_container(built: Built) -> None:
    info = describe(built.multi_soc_ctx)
    assert info["wrapper"]["nodes"][0]["attributes"]["is_multi_soc_ep_context"] == 1
    b = info["binaries"][0]
    assert b["format"] == "multi_soc"
    assert sorted((t["soc_model"], t["htp_arch"]) for t in b["targets"]) == [(60, 73), (69, 79)]
    assert {t["entry"] for t in b["targets"]} <= {e["name"] for e in b["entries"]}
    assert [x["name"] for x in b["graphs"][0]["inputs"]] == ["image"]
    text = format_text(info)
    assert "SC8380XP" in text and "SM8750" in text


def _truncated(tmp: Path, built: Built) -> Path:
    data = bin_of(built.conv_ctx).read_bytes()
    (tmp / "trunc.bin").write_bytes(data[: len(data) // 3])
    return tmp / "trunc.bin"


def _random(tmp: Path, built: Built) -> Path:
    (tmp / "random.bin").write_bytes(np.random.default_rng(0).bytes(8192))
    return tmp / "random.bin"


def _empty(tmp: Path, built: Built) -> Path:
    (tmp / "empty.bin").write_bytes(b"")
    return tmp / "empty.bin"


def _missing(tmp: Path, built: Built) -> Path:
    return tmp / "missing.bin"


def _plain_onnx(tmp: Path, built: Built) -> Path:
    onnx.save(conv_model(), tmp / "plain.onnx")
    return tmp / "plain.onnx"


def _garbage_onnx(tmp: Path, built: Built) -> Path:
    (tmp / "garbage.onnx").write_bytes(b"\xff" * 100)
    return tmp / "garbage.onnx"


def _ctx_without_bin(tmp: Path, built: Built) -> Path:
    return Path(shutil.copy(built.conv_ctx, tmp / "conv_ctx.onnx"))


@pytest.mark.parametrize("make", [_truncated, _random, _empty, _missing, _plain_onnx, _garbage_onnx,
                                  _ctx_without_bin])
def test_bad_input_is_an_inspect_error(tmp_path: Path, built: Built,
                                      make: Callable[[Path, Built], Path]) -> None:
    path = make(tmp_path, built)
    with pytest.raises(InspectError) as e:
        describe(path)
    assert str(path) in e.value.message and "\n" not in str(e.value) and e.value.hint


def test_child_timeout_is_an_inspect_error(tmp_path: Path) -> None:
    """A reader that never finishes (a FIFO no one writes: its open blocks) ends at the timeout. A real binary with
    a 1 ms timeout did not: on a loaded machine the child could finish before communicate() started counting."""
    stuck = tmp_path / "stuck.bin"
    os.mkfifo(stuck)
    with pytest.raises(InspectError, match="did not finish"):
        read_binary_info("slow", path=stuck, timeout=1.0)
