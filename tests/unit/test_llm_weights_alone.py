"""llm/weights_alone.py: a QDQ graph onnxruntime's quantizer wrote, with its activations' Q/DQ pairs taken out and
run with SESSION_CONFIG, computes the float graph with the quantized weights: the same outputs as the float graph
whose weights are the dequantized integers, and a graph output keeps its name."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def test_float_activations_leaves_the_weights_quantized(tmp_path: Path) -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from ctxbuild.llm.weights_alone import SESSION_CONFIG, weights_alone

    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
    # (a Sigmoid, not a Relu: the quantizer folds a Relu into its output's range)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Sigmoid", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    float_model = tmp_path / "float.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), float_model)
    xs = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"x": x} for x in xs])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    qdq = tmp_path / "part" / "model.onnx"
    qdq.parent.mkdir()
    quantize_static(str(float_model), str(qdq), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt16, weight_type=QuantType.QInt8, per_channel=True,
                    use_external_data_format=True)
    [alone] = weights_alone({(0, 4, 0): qdq}, tmp_path / "alone").values()
    m = onnx.load(alone)
    assert [o.name for o in m.graph.output] == ["y"]
    assert sum(n.op_type == "DequantizeLinear" for n in m.graph.node) == 2  # the two weights' only
    assert not any(n.op_type == "QuantizeLinear" for n in m.graph.node)

    # the reference: the float graph with each weight replaced by its dequantized integers
    q = onnx.load(qdq)
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    deq = {}
    for n in q.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            scale, zero = inits[n.input[1]], inits[n.input[2]].astype(np.float32)
            deq[n.output[0]] = (inits[n.input[0]].astype(np.float32) - zero) * scale  # per channel: axis 1
    matmuls = [n for n in q.graph.node if n.op_type == "MatMul"]
    w1q, w2q = (deq[m_.input[1]] for m_ in matmuls)
    so = ort.SessionOptions()
    for k, v in SESSION_CONFIG.items():
        so.add_session_config_entry(k, v)
    run = ort.InferenceSession(str(alone), so, providers=["CPUExecutionProvider"])
    fused = ort.InferenceSession(str(alone), providers=["CPUExecutionProvider"])
    full = ort.InferenceSession(str(qdq), providers=["CPUExecutionProvider"])
    for x in xs:
        want = 1 / (1 + np.exp(-(x @ w1q))) @ w2q
        got = run.run(None, {"x": x})[0]
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
        # without the config onnxruntime fuses DequantizeLinear + MatMul into 8-bit dynamic quantization
        assert not np.allclose(fused.run(None, {"x": x})[0], want, rtol=1e-3, atol=1e-3)
        assert not np.allclose(full.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)  # the QDQ graph's differ
