"""weight_snr over a QDQ model: an empty constant (a [1, 0, 1] tensor an exporter concatenates, as an EEG spindle
detector's head does) has no SNR and must not stop the diagnosis (it raised "zero-size array to reduction operation
maximum", and the precision search went on without its mixed candidate)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.verify.layerloss import weight_snr
from tests._qnn_models import IR_VERSION


def _save(path: Path, nodes: list, inits: list) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION), str(path))
    return path


def test_weight_snr_skips_an_empty_constant(tmp_path: Path) -> None:
    w = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4, 1)
    ref = _save(tmp_path / "ref.onnx", [helper.make_node("Mul", ["x", "w"], ["m"]),
                                        helper.make_node("Concat", ["m", "e"], ["y"], axis=1)],
                [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros((1, 0, 1), np.float32), "e")])
    scale, zp = np.array(1 / 127, np.float32), np.array(0, np.int8)
    qdq = [numpy_helper.from_array(np.round(w / scale).astype(np.int8), "w_quantized"),
           numpy_helper.from_array(np.zeros((1, 0, 1), np.int8), "e_quantized"),
           numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")]
    q = _save(tmp_path / "qdq.onnx", [
        helper.make_node("DequantizeLinear", ["w_quantized", "s", "z"], ["w_DequantizeLinear_Output"]),
        helper.make_node("DequantizeLinear", ["e_quantized", "s", "z"], ["e_DequantizeLinear_Output"]),
        helper.make_node("Mul", ["x", "w_DequantizeLinear_Output"], ["m"]),
        helper.make_node("Concat", ["m", "e_DequantizeLinear_Output"], ["y"], axis=1)], qdq)
    snr = weight_snr(ref, q)
    assert set(snr) == {"w"} and snr["w"] > 40, snr
