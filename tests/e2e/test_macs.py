"""graph/macs.py: multiply-accumulates per node from the graph and its shapes, counted by hand here."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.graph.macs import node_macs, share
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
