"""qnn/lower.py: wrappers rewritten with the lowest IR and only the opsets their nodes use. Unit cases on
hand-made graphs (what each op version and data type needs), real wrappers compiled by the QNN EP (same
results on the simulator after lowering), and the point of it: onnxruntime 1.24.4 opens them."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.qnn.lower import lower, lower_file


def _opsets(m: onnx.ModelProto) -> dict[str, int]:
    return {o.domain: o.version for o in m.opset_import}


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int]], outputs: list[tuple[str, int]],
           inits: list[TensorProto] = (), opset: int = 21) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, [1, 4]) for n, t in inputs],
                          [helper.make_tensor_value_info(n, t, [1, 4 * len(nodes[0].input) if nodes[0].op_type == "Concat" else 4])
                           for n, t in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1),
                                               helper.make_opsetid("ai.onnx.ml", 5)], ir_version=14)


def _q(zp_type: int, scale_shape: tuple[int, ...] = (), **attrs: int) -> onnx.ModelProto:
    n = int(np.prod(scale_shape))
    inits = [numpy_helper.from_array(np.ones(scale_shape, np.float32), "s"),
             helper.make_tensor("z", zp_type, list(scale_shape), [0] * n)]
    return _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], **attrs)],
                  [("x", TensorProto.FLOAT)], [("y", zp_type)], inits)


@pytest.mark.parametrize("model, ir, opsets", [
    # uint8, one scale: QuantizeLinear-10 (IR 5 per onnx's VERSION_TABLE)
    (_q(TensorProto.UINT8), 5, {"": 10}),
    # per-axis: 13 (`axis` came with 13), whether the attribute is written or only the scale is a vector
    (_q(TensorProto.UINT8, (4,), axis=1), 7, {"": 13}),
    (_q(TensorProto.UINT8, (4,)), 7, {"": 13}),
    # 16- and 4-bit integers: 21; int4 needs IR 10
    (_q(TensorProto.UINT16), 10, {"": 21}),
    (_q(TensorProto.INT4), 10, {"": 21}),
    # Concat: onnxruntime's floor of opset 7 (it has no Concat-1 kernel); a negative axis needs 11
    (_model([helper.make_node("Concat", ["a", "b"], ["c"], axis=1)], [("a", 1), ("b", 1)], [("c", 1)]), 3, {"": 7}),
    (_model([helper.make_node("Concat", ["a", "b"], ["c"], axis=-1)], [("a", 1), ("b", 1)], [("c", 1)]), 6, {"": 11}),
    # another op stays at the version its schema dates from (Relu-14 at opset 21)
    (_model([helper.make_node("Relu", ["a"], ["c"])], [("a", 1)], [("c", 1)]), 7, {"": 14}),
    # only com.microsoft nodes: no default domain; initializers (LoRA slot defaults) need IR 4
    (_model([helper.make_node("EPContext", ["a"], ["c"], domain="com.microsoft")], [("a", 1)], [("c", 1)]),
     3, {"com.microsoft": 1}),
    (_model([helper.make_node("EPContext", ["a"], ["c"], domain="com.microsoft")], [("a", 1)], [("c", 1)],
            [numpy_helper.from_array(np.zeros((1, 4), np.float32), "a")]), 4, {"com.microsoft": 1}),
])
def test_lowest_ir_and_opsets(model: onnx.ModelProto, ir: int, opsets: dict[str, int]) -> None:
    before = copy.deepcopy(model)
    lower(model)
    assert (model.ir_version, _opsets(model)) == (ir, opsets)
    if "com.microsoft" not in opsets:
        onnx.checker.check_model(model, full_check=True)  # onnx agrees the lowered model is valid
    again = copy.deepcopy(model)
    assert lower(again).SerializeToString() == model.SerializeToString()  # idempotent
    del model.opset_import[:], before.opset_import[:]
    model.ir_version = before.ir_version
    assert model == before  # nothing but the IR version and the opset imports changed


# --- real wrappers, compiled by the QNN EP -----------------------------------------------------------

@pytest.fixture(scope="module")
def wrappers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from tests._qnn_models import compile_model, conv_model, matmul_model, quantize_model, random_inputs

    root = tmp_path_factory.mktemp("lower")
    conv = quantize_model(conv_model(), root / "conv.qdq.onnx")
    mm = matmul_model("mm")
    u8 = root / "mm.u8.qdq.onnx"  # uint8 activations: the graph-I/O Q/DQ left on the CPU are ai.onnx ones
    reader = iter([random_inputs(mm, seed) for seed in range(4)])
    calibration = type("Reader", (), {"get_next": lambda self: next(reader, None)})()
    quantize(mm, str(u8), get_qnn_qdq_config(mm, calibration, activation_type=QuantType.QUInt8,
                                             weight_type=QuantType.QUInt8))
    return {"conv": compile_model(conv, root / "conv_ctx.onnx"),
            "u8_fallback": compile_model(u8, root / "u8_ctx.onnx", cpu_fallback=True)}


@pytest.mark.e2e
def test_real_wrappers_lower_and_run_the_same(wrappers: dict[str, Path], tmp_path: Path) -> None:
    from tests._qnn_models import conv_model, matmul_model, random_inputs, run

    expected = {"conv": (3, {"com.microsoft": 1}), "u8_fallback": (7, {"": 13, "com.microsoft": 1})}
    models = {"conv": conv_model(), "u8_fallback": matmul_model("mm")}
    for name, path in wrappers.items():
        raw = onnx.load(str(path))
        assert raw.ir_version == onnx.IR_VERSION and len(raw.opset_import) > 5  # what onnxruntime 1.32 writes
        lowered = path.with_name(f"lowered_{path.name}")
        lowered.write_bytes(path.read_bytes())
        lower_file(lowered)
        m = onnx.load(str(lowered))
        assert (m.ir_version, _opsets(m)) == expected[name]
        assert {p.key: p.value for p in m.metadata_props} == {p.key: p.value for p in raw.metadata_props}
        feeds = random_inputs(models[name])
        for a, b in zip(run(path, feeds), run(lowered, feeds)):
            assert np.array_equal(a, b)


@pytest.mark.e2e
def test_onnxruntime_1_24_opens_lowered_wrappers(wrappers: dict[str, Path]) -> None:
    """In onnxruntime 1.24.4 + onnxruntime-qnn 2.3.0 the raw wrapper is refused for its IR version; the lowered
    one opens and fails only where it must: the binary is from QAIRT 2.51, that runtime is QAIRT 2.47."""
    from tests._old_runtime import load, old_runtime_python

    python = old_runtime_python()
    for path in wrappers.values():
        raw = load(python, path)
        assert not raw["ok"] and "Unsupported model IR version: 14, max supported IR version: 13" in raw["error"]
        lowered = path.with_name(f"old_{path.name}")
        lowered.write_bytes(path.read_bytes())
        lower_file(lowered)
        r = load(python, lowered)
        assert not r["ok"] and "QNN_CONTEXT_ERROR_INVALID_ARGUMENT" in r["error"], r["error"]
        assert "IR version" not in r["error"] and "opset" not in r["error"].lower()
