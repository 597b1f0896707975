"""The attention mask as the static graphs apply it (ctxbuild/llm/mask.py): a masked slot below every score of its
row, whatever the row's offset, where an additive MASK_NEG is beaten by a model's large score offsets (Qwen2.5-Coder's
float static graphs chose other tokens than its export on 3 of 8 prompts). Real onnxruntime, real QNN simulator."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ctxbuild.llm.canonical import MASK_NEG
from ctxbuild.llm.mask import below_row_min
from ctxbuild.toolchain.installed import session_options

pytestmark = pytest.mark.e2e
AR, CL = 2, 4


def _attention(rewritten: bool) -> onnx.ModelProto:
    """Softmax(scores + attention_mask) over [1, 1, AR, CL], as every exporter's static graph writes it."""
    nodes = [helper.make_node("Mul", ["scores", "one"], ["scaled"], name="/model/layers.0/attn/Mul"),
             helper.make_node("Add", ["scaled", "attention_mask"], ["masked"], name="/model/layers.0/attn/Add"),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1, name="/model/layers.0/attn/Softmax")]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, AR, CL]) for n in ("scores", "attention_mask", "p")]
    m = helper.make_model(helper.make_graph(nodes, "attn", io[:2], io[2:], [helper.make_tensor("one", 1, [], [1.0])]),
                          opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    if rewritten:
        assert below_row_min(m) == {"/model/layers.0/attn/Add/ReduceMin_lowered": "/model/layers.0/attn/Add",
                                    "/model/layers.0/attn/Add/Add_lowered": "/model/layers.0/attn/Add",
                                    "attention_mask/lowered_masked": "/model/layers.0/attn/Add"}
        assert not any(n.op_type == "Add" and "attention_mask" in n.input for n in m.graph.node)
    return m


def _feeds() -> dict[str, np.ndarray]:
    # valid keys score ~-300 (a large offset common to the row), an empty cache slot's zero key scores 0
    scores = np.array([[-300.0, -301.0, 0.0, -299.0], [-302.0, -300.5, 0.0, -300.0]], np.float32)[None, None]
    mask = np.array([[0, 0, MASK_NEG, MASK_NEG], [0, 0, MASK_NEG, 0]], np.float32)[None, None]
    return {"scores": scores, "attention_mask": mask}


def test_a_masked_slot_stays_masked_whatever_the_rows_offset(tmp_path: Path) -> None:
    feeds = _feeds()
    valid = feeds["attention_mask"] == 0
    for rewritten in (False, True):
        onnx.save(_attention(rewritten), tmp_path / f"{rewritten}.onnx")
        p = ort.InferenceSession(str(tmp_path / f"{rewritten}.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        on_masked = float(p[~valid].max())
        if rewritten:  # what the export's -inf mask gives: the valid slots' softmax alone
            top = np.where(valid, feeds["scores"], -np.inf).max(-1, keepdims=True)
            want = np.where(valid, np.exp(np.where(valid, feeds["scores"] - top, 0)), 0)
            np.testing.assert_allclose(p, want / want.sum(-1, keepdims=True), atol=1e-6)
        else:  # additive: the slot scoring 0 - 100 outweighs valid ones at -300
            assert on_masked > 0.99


def test_the_rewritten_mask_compiles_and_runs_on_the_htp(tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    f, q, ctx = tmp_path / "m.onnx", tmp_path / "m.qdq.onnx", tmp_path / "m_ctx.onnx"
    onnx.save(_attention(True), f)
    reader = iter([_feeds()])
    config = get_qnn_qdq_config(str(f), type("R", (), {"get_next": lambda self: next(reader, None)})(),
                                activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8)
    quantize(str(f), str(q), config)
    options = {"soc_model": "SM8650", "htp_arch": "75"}
    ort.ModelCompiler(session_options(options, cpu_fallback=False), str(q),
                      embed_compiled_data_into_model=False).compile_to_file(str(ctx))
    p = ort.InferenceSession(str(ctx), session_options(options, cpu_fallback=False)).run(None, _feeds())[0]
    ref = ort.InferenceSession(str(f), providers=["CPUExecutionProvider"]).run(None, _feeds())[0]
    assert float(p[_feeds()["attention_mask"] != 0].max()) < 1e-3 and np.abs(p - ref).max() < 0.02, (p, ref)
