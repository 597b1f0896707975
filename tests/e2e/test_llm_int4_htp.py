"""Block-wise and per-channel int4 weights as llm.quantization writes them, compiled by the real QNN EP and run on its
HTP simulator against the same QDQ graph on the CPU (docs/llm.md, Weight quantization); and the block counts the
simulator crashed on are refused at plan time."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ctxbuild.errors import RecipeError
from ctxbuild.llm import int4
from ctxbuild.llm.int4_graph import Weights4, rewrite
from ctxbuild.toolchain import installed as toolchain
from tests.unit.test_llm_int4 import _weights, qdq_int4

pytestmark = pytest.mark.e2e  # compiles with the real QNN EP in-process

SOCS = {"68": "30", "73": "43", "75": "57", "79": "69", "81": "87"}


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("block_size", [None, 32])
@pytest.mark.parametrize("arch", sorted(SOCS))
def test_int4_weights_compile_and_match_the_cpu(tmp_path: Path, arch: str, block_size: int | None) -> None:
    import onnxruntime as ort

    w1, x = _weights(256, 64)
    w2 = _weights(64, 32, seed=1)[0]
    xs = [np.random.default_rng(i).standard_normal((1, 16, 256)).astype(np.float32) for i in range(4)]
    src, qdq = qdq_int4(tmp_path, w1, w2, xs)
    rewrite(qdq, src, Weights4({"w1": int4.int4(w1, block_size, x, search=True), "w2": int4.int4(w2, None)}))
    options = {"soc_model": SOCS[arch], "htp_arch": arch}
    if block_size:
        options["enable_block_quant_weight_optimization"] = "1"
    ctx = tmp_path / "m_ctx.onnx"
    toolchain.compile_model(qdq, ctx, options, embed=False, cpu_fallback=False)
    sim = ort.InferenceSession(str(ctx), toolchain.session_options({}, cpu_fallback=False)).run(None, {"x": xs[1]})[0]
    cpu = ort.InferenceSession(str(qdq), providers=["CPUExecutionProvider"]).run(None, {"x": xs[1]})[0]
    assert _cos(sim, cpu) > 0.9999, _cos(sim, cpu)  # measured 0.99998-0.999999


def test_off_grid_block_scales_leave_the_cpu(tmp_path: Path) -> None:
    """Why the scales are written on the LPBQ grid: block scales off it are rounded by the EP, and the HTP then
    computes other weights than the CPU's QDQ graph (the check above would miss by far more)."""
    import onnxruntime as ort

    w1, x = _weights(256, 64)
    w2 = _weights(64, 32, seed=1)[0]
    xs = [np.random.default_rng(i).standard_normal((1, 16, 256)).astype(np.float32) for i in range(4)]
    src, qdq = qdq_int4(tmp_path, w1, w2, xs)
    raw = (np.abs(w1).reshape(8, 32, 64).max(1) / 7).astype(np.float32)  # per-block min/max, not on the grid
    rewrite(qdq, src, Weights4({"w1": int4.quantize(w1, raw, 32), "w2": int4.int4(w2, None)}))
    ctx = tmp_path / "m_ctx.onnx"
    toolchain.compile_model(qdq, ctx, {"soc_model": "57", "htp_arch": "75",
                                       "enable_block_quant_weight_optimization": "1"}, embed=False, cpu_fallback=False)
    sim = ort.InferenceSession(str(ctx), toolchain.session_options({}, cpu_fallback=False)).run(None, {"x": xs[1]})[0]
    cpu = ort.InferenceSession(str(qdq), providers=["CPUExecutionProvider"]).run(None, {"x": xs[1]})[0]
    assert _cos(sim, cpu) < 0.9999


def test_block_counts_the_simulator_failed_on_are_refused() -> None:
    from ctxbuild.recipes.llm import _quantization

    def at(*path: object) -> str:
        return "r.yaml:3"

    facts = {"matmul_rows": {"model.layers.0.mlp.down_proj.weight": 576, "model.layers.0.q_proj.weight": 1536}}
    q = {"int4": "block", "block_size": 64}
    with pytest.raises(RecipeError, match=r"r.yaml:3: block_size 64 cuts model.layers.0.mlp.down_proj.weight \(576 "
                                          r"rows\) into 9 blocks: the HTP simulator crashed \(SIGSEGV\)"):
        _quantization(at, {"quantization": q}, "w4a16", facts)
    with pytest.raises(RecipeError, match=r"into 9 blocks: the HTP simulator gave wrong outputs"):
        _quantization(at, {"quantization": {**q, "block_size": 16}}, "w4a16", {"matmul_rows": {"w": 144}})
    assert _quantization(at, {"quantization": {**q, "block_size": 32}}, "w4a16", facts)["block_size"] == 32
    assert _quantization(at, {"quantization": {"int4": "block"}}, "w4a16", facts)["block_size"] == 32  # the default
    with pytest.raises(RecipeError, match="precision is w8a16"):
        _quantization(at, {"quantization": q}, "w8a16", facts)


@pytest.mark.parametrize("rows,block_size", [(576, 64), (144, 16)])
def test_a_refused_block_count_fails_on_the_simulator(tmp_path: Path, rows: int, block_size: int) -> None:
    """What the refusal rests on, re-measured: one such MatMul crashes the simulator (64) or leaves the CPU (16)."""
    import subprocess
    import sys

    w1, x = _weights(rows, 64)
    w2 = _weights(64, 32, seed=1)[0]
    xs = [np.random.default_rng(i).standard_normal((1, 16, rows)).astype(np.float32) for i in range(4)]
    src, qdq = qdq_int4(tmp_path, w1, w2, xs)
    rewrite(qdq, src, Weights4({"w1": int4.int4(w1, block_size), "w2": int4.int4(w2, None)}))
    ctx = tmp_path / "m_ctx.onnx"
    toolchain.compile_model(qdq, ctx, {"soc_model": "57", "htp_arch": "75",
                                       "enable_block_quant_weight_optimization": "1"}, embed=False, cpu_fallback=False)
    np.save(tmp_path / "x.npy", xs[1])
    code = ("import sys, numpy as np, onnxruntime as ort; from ctxbuild.toolchain import installed as t; "
            "s = ort.InferenceSession(sys.argv[1], t.session_options({}, cpu_fallback=False)); "
            "np.save(sys.argv[3], s.run(None, {'x': np.load(sys.argv[2])})[0])")
    done = subprocess.run([sys.executable, "-c", code, str(ctx), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                          capture_output=True)
    if block_size == 64:
        assert done.returncode == -11, done.returncode
    else:
        import onnxruntime as ort

        cpu = ort.InferenceSession(str(qdq), providers=["CPUExecutionProvider"]).run(None, {"x": xs[1]})[0]
        assert done.returncode == 0 and _cos(np.load(tmp_path / "y.npy"), cpu) < 0.95
