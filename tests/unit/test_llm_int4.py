"""llm.quantization's int4 weights (ctxbuild/llm/int4.py, int4_graph.py) on small models with real onnxruntime: the
block scales are on the grid the QNN EP's LPBQ keeps, the scale search lowers the output error it minimizes, and the
QDQ rewrite of onnxruntime's own quantizer output dequantizes to exactly the chosen weights."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.llm import int4
from ctxbuild.llm.int4_graph import Weights4, matmul_weights, ranked_8bit, rewrite


def _weights(k: int = 256, n: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A weight with an outlier input row (what hurts per-channel ranges) and activations with an outlier feature."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32) * 0.05
    w[7] *= 12
    x = rng.standard_normal((128, k)).astype(np.float32)
    x[:, 3] *= 10
    return w, x


def test_block_scales_are_on_the_lpbq_grid() -> None:
    w, _ = _weights()
    q = int4.int4(w, 32)
    assert q.scales.shape == (8, 64) and q.values.dtype == np.int8
    channel = q.scales.max(0) / int4.LPBQ_LEVELS
    steps = q.scales / channel
    np.testing.assert_allclose(steps, np.rint(steps), atol=1e-4)  # integer multiples of the channel scale
    assert steps.min() >= 1 - 1e-4 and np.allclose(steps.max(0), 16)  # 1..16, 16 in every channel
    assert q.values.min() >= -8 and q.values.max() <= 7
    assert np.abs(q.dequantized() - w).max() <= np.repeat(q.scales, 32, 0).max() / 2 + 1e-6  # min/max: no clipping


def test_the_eps_conversion_keeps_the_scales() -> None:
    """onnxruntime-qnn's BQ -> LPBQ rule (channel = max block / 16, integer = round(block / channel) in 1..16) gives
    back the scales written: the HTP computes the weights the CPU's QDQ graph does."""
    w, x = _weights()
    for search in (False, True):
        s = int4.int4(w, 32, x, search).scales
        channel = s.max(0) / 16
        back = channel * np.clip(np.round(s / channel), 1, 16)
        np.testing.assert_allclose(back, s, rtol=1e-6)


@pytest.mark.parametrize("block_size", [None, 32])
def test_scale_search_lowers_the_output_error(block_size: int | None) -> None:
    w, x = _weights()
    plain, searched = int4.int4(w, block_size, x), int4.int4(w, block_size, x, search=True)
    direct = float(np.square(x @ (w - searched.dequantized())).sum() / np.square(x @ w).sum())
    assert searched.error == pytest.approx(direct, rel=1e-5)
    assert searched.error < 0.9 * plain.error, (searched.error, plain.error)
    assert 0 < searched.clipped <= 1


def test_block_wise_beats_per_channel_on_an_outlier_row() -> None:
    w, x = _weights()
    assert int4.int4(w, 32, x).error < 0.5 * int4.int4(w, None, x).error


def test_blockable() -> None:
    assert int4.blockable(256, 32) and not int4.blockable(341, 32) and not int4.blockable(32, 32)


def test_ranking_keeps_the_most_sensitive_within_the_share() -> None:
    w, x = _weights()
    w4 = Weights4({"a": int4.int4(w, None, x), "b": int4.int4(w * 0 + w.mean(), None, x),
                   "c": int4.int4(w, 32, x)})
    assert w4.ranking()[0] == "a"
    assert ranked_8bit(w4, 0.34) == ["a"] and ranked_8bit(w4, 0.2) == [] and len(ranked_8bit(w4, 1.0)) == 3


def _float_model(d: Path, w1: np.ndarray, w2: np.ndarray) -> Path:
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, w1.shape[0]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, w2.shape[1]])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    path = d / "float.onnx"
    onnx.save(m, str(path))
    return path


class _Reader:
    def __init__(self, xs: list[np.ndarray]) -> None:
        self._it = iter(xs)

    def get_next(self) -> dict[str, np.ndarray] | None:
        x = next(self._it, None)
        return None if x is None else {"x": x}


def qdq_int4(d: Path, w1: np.ndarray, w2: np.ndarray, xs: list[np.ndarray], bits: int = 4) -> tuple[Path, Path]:
    """A float model and its QDQ model as llm_quantize makes it: onnxruntime's QNN config, uint16 activations,
    symmetric int4 (int8) weights (one scale per MatMul weight: the config's choice), external data."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    src = _float_model(d, w1, w2)
    config = get_qnn_qdq_config(str(src), _Reader(xs), activation_type=QuantType.QUInt16,
                                weight_type=QuantType.QInt4 if bits == 4 else QuantType.QInt8, per_channel=True)
    config.use_external_data_format = True
    quantize(str(src), str(d / "qdq.onnx"), config)
    return src, d / "qdq.onnx"


def _run(path: Path, x: np.ndarray, outputs: list[str]) -> list[np.ndarray]:
    import onnxruntime as ort

    m = onnx.load(str(path))
    m.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in outputs)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(outputs, {"x": x})


@pytest.mark.parametrize("block_size,bits", [(None, 4), (32, 4), (None, 8)])
def test_rewrite_dequantizes_to_the_chosen_weights(tmp_path: Path, block_size: int | None, bits: int) -> None:
    w1, x = _weights(256, 64)
    w2 = _weights(64, 32, seed=1)[0]
    xs = [np.random.default_rng(i).standard_normal((1, 16, 256)).astype(np.float32) for i in range(4)]
    src, qdq = qdq_int4(tmp_path, w1, w2, xs, bits)
    names = matmul_weights(onnx.load(str(src)))
    assert names == {"mm1": "w1", "mm2": "w2"}
    before = {t.name: t.dims for t in onnx.load(str(qdq)).graph.initializer}
    assert all(before[f"{w}_scale"] == [] for w in ("w1", "w2"))  # onnxruntime's QNN config: one scale per matrix
    chosen = Weights4({"w1": int4.int4(w1, block_size, x, search=True, bits=bits),
                       "w2": int4.int4(w2, None, bits=bits)})
    assert rewrite(qdq, src, chosen) == 2
    # the integers in raw bytes, so they go to the data file (as int32_data they stayed inline: 1.9 GB graph files
    # at the 1B shape's tied head)
    raw = onnx.load(str(qdq), load_external_data=False)
    big = [t for t in raw.graph.initializer if np.prod(t.dims) >= 4096]
    assert big and all(t.data_location == TensorProto.EXTERNAL for t in big), [(t.name, t.data_location) for t in big]
    m = onnx.load(str(qdq))
    kind = TensorProto.INT4 if bits == 4 else TensorProto.INT8
    dq = {n.input[0]: n for n in m.graph.node if n.op_type == "DequantizeLinear"
          and any(t.name == n.input[0] and t.data_type == kind for t in m.graph.initializer)}
    assert len(dq) == 2
    first = next(n for n in dq.values() if n.output[0] in {i for k in m.graph.node if k.name == "mm1" for i in k.input})
    attrs = {a.name: a.i for a in first.attribute}
    assert attrs == ({"axis": 1} if block_size is None else {"axis": 0, "block_size": block_size})
    w1q, y = _run(qdq, xs[0], [first.output[0], "y"])
    np.testing.assert_array_equal(w1q, chosen.chosen["w1"].dequantized())  # onnxruntime's DQ: exactly the choice
    # the whole graph: the chosen weights' float computation up to the 16-bit activations' rounding
    ref = np.maximum(xs[0] @ chosen.chosen["w1"].dequantized(), 0) @ chosen.chosen["w2"].dequantized()
    assert float((y * ref).sum() / np.linalg.norm(y) / np.linalg.norm(ref)) > 0.9999
