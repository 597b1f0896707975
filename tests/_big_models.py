"""LLM-sized test models with cheap structure: a chain of square MatMuls whose weights live in ONNX
external data, written tensor by tensor (the generator holds two weights in memory at most).

- `qdq`: already quantized (uint8 weights, uint16 activations, QDQ format): 1 byte per weight.
- `fp16`: float32 weights, compiled in fp16 by the HTP: 4 bytes per weight in the model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, save_model

OPSET = 21  # QuantizeLinear/DequantizeLinear with uint16


def matmul_chain(path: Path, *, dim: int, layers: int, precision: str, seed: int = 0, rows: int = 1) -> int:
    """Write `path` + `path.data`; returns the external data's size in bytes. Input and output are
    [rows, dim]: two chains with the same seed and different rows are an LLM's prefill and decode graphs,
    sharing every weight."""
    rng = np.random.default_rng(seed)
    data_name = path.name + ".data"
    nodes, inits, prev, offset = [], [], "x", 0
    with open(path.with_name(data_name), "wb") as data:
        if precision == "qdq":
            inits += [_scalar("act_s", TensorProto.FLOAT, 4.0 / 65535), _scalar("act_zp", TensorProto.UINT16, 32768),
                      _scalar("w_s", TensorProto.FLOAT, 2.0 / (255 * np.sqrt(dim))), _scalar("w_zp", TensorProto.UINT8, 128)]
            nodes += [helper.make_node("QuantizeLinear", ["x", "act_s", "act_zp"], ["xq"]),
                      helper.make_node("DequantizeLinear", ["xq", "act_s", "act_zp"], ["h"])]
            prev = "h"
        # One random matrix, varied per layer by a cheap elementwise step: drawing 2 GB of normals is slow.
        base = (rng.integers(0, 256, (dim, dim), dtype=np.uint8) if precision == "qdq"
                else rng.standard_normal((dim, dim), dtype=np.float32) / np.float32(np.sqrt(dim)))
        for i in range(layers):
            w = f"w{i}"
            if precision == "qdq":
                arr = base + np.uint8(i * 37 % 256)  # wraps modulo 256
                inits.append(_external(w, TensorProto.UINT8, arr, data, data_name, offset))
                nodes += [helper.make_node("DequantizeLinear", [w, "w_s", "w_zp"], [f"{w}_dq"]),
                          helper.make_node("MatMul", [prev, f"{w}_dq"], [f"m{i}"]),
                          helper.make_node("QuantizeLinear", [f"m{i}", "act_s", "act_zp"], [f"m{i}_q"]),
                          helper.make_node("DequantizeLinear", [f"m{i}_q", "act_s", "act_zp"], [f"m{i}_dq"])]
                prev = f"m{i}_dq"
            else:
                arr = base * np.float32(1 - i / (2 * layers))  # distinct bytes per layer: QNN stores equal tensors once
                inits.append(_external(w, TensorProto.FLOAT, arr, data, data_name, offset))
                nodes.append(helper.make_node("MatMul", [prev, w], [f"m{i}"]))
                prev = f"m{i}"
            offset += arr.nbytes
            del arr
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(nodes, "matmul_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, dim])], inits)
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10), str(path))
    return offset


def _scalar(name: str, dtype: int, value: float) -> TensorProto:
    return helper.make_tensor(name, dtype, [], [value])


def _external(name: str, dtype: int, arr: np.ndarray, data, location: str, offset: int) -> TensorProto:
    data.write(arr.data)  # contiguous: no bytes copy
    t = TensorProto(name=name, data_type=dtype, dims=arr.shape, data_location=TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(arr.nbytes))):
        t.external_data.add(key=k, value=v)
    return t
