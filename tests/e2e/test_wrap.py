"""`wrap_binary` round trips: wrappers for binaries compiled by the real toolchain, loaded and run on
the QNN EP's x86 HTP simulator (nothing mocked)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from ctxbuild.qnn.contextbin import describe
from ctxbuild.errors import InspectError
from ctxbuild.qnn.wrap import wrap_binary
from tests._qnn_models import Built, bin_of, build_models, conv_model, matmul_model, random_inputs, run

pytestmark = pytest.mark.e2e  # compiles with the real QNN EP in-process


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_models(tmp_path_factory.mktemp("models"))


def _epcontext(model_path: Path) -> dict[str, Any]:
    (node,) = [n for n in onnx.load(model_path).graph.node if n.op_type == "EPContext"]
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and np.array_equal(x, y)


def test_wrap_ctxbuild_binary_round_trip(built: Built, tmp_path: Path) -> None:
    """A ctxbuild-compiled binary (float QNN I/O): the wrapper carries the attributes the EP itself
    writes and runs to the very same outputs as the EP's own _ctx.onnx."""
    (wrapper,) = wrap_binary(bin_of(built.conv_ctx), tmp_path)
    graph = describe(bin_of(built.conv_ctx))["binaries"][0]["graphs"][0]["name"]
    assert wrapper == tmp_path / f"{graph}_ctx.onnx"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([wrapper.name, bin_of(built.conv_ctx).name])
    assert _epcontext(wrapper) == _epcontext(built.conv_ctx)
    feeds = random_inputs(conv_model())
    _assert_same(run(wrapper, feeds), run(built.conv_ctx, feeds))


def test_wrap_embedded(built: Built, tmp_path: Path) -> None:
    (wrapper,) = wrap_binary(bin_of(built.conv_ctx), tmp_path, embed=True)
    assert [p.name for p in tmp_path.iterdir()] == [wrapper.name]  # no .bin copied
    attrs = _epcontext(wrapper)
    assert attrs["embed_mode"] == 1 and attrs["ep_cache_context"] == bin_of(built.conv_ctx).read_bytes()
    feeds = random_inputs(conv_model())
    _assert_same(run(wrapper, feeds), run(built.conv_ctx, feeds))


def test_wrap_quantized_graph_with_float_io(built: Built, tmp_path: Path) -> None:
    """QNN graph with UFIXED_POINT_16 I/O: Q/DQ around the EPContext node from the binary's own
    scale/offset give exactly what the EP's wrapper (with its ONNX Q/DQ) gives."""
    (wrapper,) = wrap_binary(bin_of(built.mm_ctx), tmp_path)
    model = onnx.load(wrapper)
    assert [n.op_type for n in model.graph.node] == [
        "QuantizeLinear", "QuantizeLinear", "EPContext", "DequantizeLinear", "DequantizeLinear"]
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [onnx.TensorProto.FLOAT] * 2
    assert set(_epcontext(wrapper)["io_name_overrides"].decode().rstrip(";").split(";")) == set(
        _epcontext(built.mm_ctx)["io_name_overrides"].decode().rstrip(";").split(";"))
    feeds = random_inputs(matmul_model("mm"), seed=3)
    _assert_same(run(wrapper, feeds), run(built.mm_ctx, feeds))


def test_wrap_quantized_io(built: Built, tmp_path: Path) -> None:
    """quantized_io exposes the uint16 tensors; fed the quantized inputs, the dequantized outputs
    match the float wrapper's."""
    (wrapper,) = wrap_binary(bin_of(built.mm_ctx), tmp_path, quantized_io=True)
    model = onnx.load(wrapper)
    assert [n.op_type for n in model.graph.node] == ["EPContext"]
    assert {i.type.tensor_type.elem_type for i in model.graph.input} == {onnx.TensorProto.UINT16}
    graph = describe(bin_of(built.mm_ctx))["binaries"][0]["graphs"][0]
    feeds = random_inputs(matmul_model("mm"), seed=3)
    qfeeds = {}
    for t in graph["inputs"]:  # QNN: real = (q + offset) * scale
        q = t["quantization"]
        qfeeds[t["name"]] = np.clip(np.rint(feeds[t["name"]] / np.float32(q["scale"])) - q["offset"],
                                    0, 65535).astype(np.uint16)
    outputs = run(wrapper, qfeeds)
    for out, t, ref in zip(outputs, graph["outputs"], run(built.mm_ctx, feeds)):
        q = t["quantization"]
        assert out.dtype == np.uint16
        np.testing.assert_allclose((out.astype(np.float32) + q["offset"]) * np.float32(q["scale"]), ref,
                                   atol=4 * q["scale"])


def test_wrap_weight_shared_binary(built: Built, tmp_path: Path) -> None:
    """One wrapper per graph, all naming the one copied binary. Not run: the x86 simulator
    segfaults loading multi-graph contexts."""
    a, b = built.shared_ctxs
    wrappers = wrap_binary(bin_of(a), tmp_path)
    assert len(wrappers) == 2 and len(list(tmp_path.glob("*.bin"))) == 1
    for wrapper, original in zip(wrappers, (a, b)):
        assert _epcontext(wrapper) == _epcontext(original)
        info = describe(wrapper)
        assert info["wrapper"]["problems"] == []
        assert info["wrapper"]["inputs"] == describe(original)["wrapper"]["inputs"]


def test_wrap_multi_soc_binary(built: Built, tmp_path: Path) -> None:
    """Not run: the simulator cannot create a context from a multi-SoC container."""
    (wrapper,) = wrap_binary(bin_of(built.multi_soc_ctx), tmp_path)
    assert _epcontext(wrapper) == _epcontext(built.multi_soc_ctx)
    assert _epcontext(wrapper)["is_multi_soc_ep_context"] == 1


def test_rewrap_in_place_leaves_no_temp_files(built: Built, tmp_path: Path) -> None:
    shutil.copy(bin_of(built.conv_ctx), tmp_path / "model.bin")
    first = wrap_binary(tmp_path / "model.bin", tmp_path)
    assert wrap_binary(tmp_path / "model.bin", tmp_path) == first  # the bin is not copied onto itself
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.bin", first[0].name])


@pytest.mark.parametrize("case", ["missing", "random", "out_dir_is_a_file"])
def test_wrap_errors(built: Built, tmp_path: Path, case: str) -> None:
    src = tmp_path / "in.bin"
    out = tmp_path / "out"
    if case == "random":
        src.write_bytes(np.random.default_rng(0).bytes(4096))
    elif case == "out_dir_is_a_file":
        shutil.copy(bin_of(built.conv_ctx), src)
        out.write_text("")
    with pytest.raises(InspectError) as e:
        wrap_binary(src, out)
    assert "\n" not in str(e.value) and e.value.hint
