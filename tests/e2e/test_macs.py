"""graph/macs.py: multiply-accumulates per node from the graph and its shapes, counted by hand here."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.graph.macs import node_macs, share, uncounted
from tests._qnn_models import IR_VERSION


def _w(name: str, *shape: int) -> object:
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def test_products_convolutions_recurrent_and_contrib_shapes() -> None:
    nodes = [
        # onnxruntime's contrib op: onnx's shape inference stops here unless macs.py passes the shape on
        helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["n"], name="norm", domain="com.microsoft"),
        helper.make_node("MatMul", ["n", "w1"], ["m"], name="mm"),  # [1, 10, 16] x [16, 32]
        helper.make_node("Gemm", ["a", "w2"], ["gm"], name="gemm", transA=1),  # A^T [5, 3] x [3, 4]
        helper.make_node("Conv", ["img", "k"], ["c"], name="conv", group=2, pads=[1, 1, 1, 1]),  # 4 -> 6 ch, 3x3
        helper.make_node("ConvTranspose", ["c", "kt"], ["ct"], name="deconv", strides=[2, 2]),  # 6 -> 2 ch, 2x2
        helper.make_node("GRU", ["seq", "W", "R"], ["h"], name="gru", hidden_size=8),  # 7 steps, in 5, hidden 8
        helper.make_node("Einsum", ["e", "we"], ["eo"], name="ein", equation="btgi,gih->btgh"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
         [("x", [1, 10, 16]), ("a", [3, 5]), ("img", [1, 4, 8, 8]), ("seq", [7, 1, 5]), ("e", [1, 10, 4, 8])]],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("r", "gm", "ct", "h", "eo")],
        [_w("g", 16), _w("w1", 16, 32), _w("w2", 3, 4), _w("k", 6, 2, 3, 3), _w("kt", 6, 2, 2, 2),
         _w("W", 1, 24, 5), _w("R", 1, 24, 8), _w("we", 4, 8, 6)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=IR_VERSION)
    got = node_macs(m)
    assert got == {"norm": 0, "mm": 10 * 32 * 16, "gemm": 5 * 4 * 3, "conv": 6 * 8 * 8 * 2 * 3 * 3,
                   "deconv": 6 * 8 * 8 * 2 * 2 * 2, "gru": 7 * (24 * 5 + 24 * 8), "ein": 10 * 4 * 8 * 6, "relu": 0}
    assert share(got, {"gru", "relu"}) == (7 * (24 * 5 + 24 * 8), sum(got.values()))


def test_int16_qdq_shapes_attention_and_unknown() -> None:
    """An int16 QDQ model's Q/DQ are com.microsoft ops onnx's shape inference stops at: an LSTM behind them counted
    nothing before (issue 48: `cpu_macs_share: null` for a speaker-embedding LSTM). Attention is counted from its
    shapes; an op with MACs whose shapes are not known, or a custom op, is None (unknown), never 0."""
    ms = "com.microsoft"
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="xq", domain=ms),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="xd", domain=ms),
        helper.make_node("DequantizeLinear", ["Wq", "s", "z"], ["W"], name="wd", domain=ms),
        helper.make_node("DequantizeLinear", ["Rq", "s", "z"], ["R"], name="rd", domain=ms),
        helper.make_node("LSTM", ["xd", "W", "R"], ["Y"], name="lstm", hidden_size=8),  # 7 steps, in 5, hidden 8
        helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["a"], name="mha", domain=ms, num_heads=2),
        helper.make_node("Attention", ["q4", "k4", "v4"], ["a4"], name="attn"),  # onnx 23, 4D
        helper.make_node("MatMul", ["dyn", "w1"], ["m"], name="mm_unknown"),  # `dyn` has no known shape
        helper.make_node("MyConv", ["img"], ["c"], name="custom", domain="com.vendor"),
    ]
    u16 = lambda n, *shape: numpy_helper.from_array(np.zeros(shape, np.uint16), n)  # noqa: E731
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
         [("x", [7, 1, 5]), ("q", [1, 10, 16]), ("k", [1, 12, 16]), ("v", [1, 12, 16]), ("q4", [1, 2, 10, 8]),
          ("k4", [1, 2, 12, 8]), ("v4", [1, 2, 12, 8]), ("dyn", None), ("img", [1, 3, 8, 8])]],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "a", "a4", "m", "c")],
        [u16("Wq", 1, 32, 5), u16("Rq", 1, 32, 8), _w("s"), u16("z"), _w("w1", 16, 4)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid(ms, 1),
                                            helper.make_opsetid("com.vendor", 1)], ir_version=IR_VERSION)
    got = node_macs(m)
    assert got["lstm"] == 7 * (32 * 5 + 32 * 8)
    assert got["mha"] == 10 * 12 * (16 + 16)  # per query and key position: Q.K^T and weights x V, all heads
    assert got["attn"] == 2 * 10 * 12 * (8 + 8)
    assert got["mm_unknown"] is None and got["custom"] is None
    assert got["xq"] == got["wd"] == 0
    assert uncounted(got) == ["mm_unknown", "custom"]
    assert share(got, {"lstm"}) == (got["lstm"], got["lstm"] + got["mha"] + got["attn"])
