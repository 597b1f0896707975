"""The tests' QNN helpers: small models compiled with the real QNN EP (test_inspect.py, test_wrap.py) and
sessions on the EP (the x86 HTP simulator) to run or load what ctxbuild built."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

from ctxbuild.toolchain import installed as toolchain

TARGET = {"soc_model": "57", "htp_arch": "75"}  # SM8650
# onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads at most 13.
IR_VERSION = 10
OPSET = [helper.make_opsetid("", 17)]
SHARED_WEIGHT = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)


def conv_model() -> onnx.ModelProto:
    """Conv+Relu, 1x3x16x16 -> 1x8x16x16."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["features"])],
        "conv",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 8, 16, 16])],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def conv_sigmoid_conv() -> onnx.ModelProto:
    """x -> Conv 'c1' -> Sigmoid 's' -> Conv 'c2' -> y: a weightless node between quantized ones."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) / 3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["a"], ["b"], name="s"),
             helper.make_node("Conv", ["b", "w2"], ["y"], name="c2", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "csc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [w1, w2])
    return helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION)


def nonzero_model() -> onnx.ModelProto:
    """Relu then NonZero (node `find_nonzero`), an op QNN rejects: a compile that fails for a real reason."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu0"),
                               helper.make_node("NonZero", ["r"], ["y"], name="find_nonzero")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def matmul_nonzero_model() -> onnx.ModelProto:
    """A MatMul (`fc`, output `h`) whose output also feeds NonZero (`nz`, a data-dependent shape QNN refuses at every
    precision); the count it gives is added back to `h`: the graph output `y` depends on both."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"), helper.make_node("NonZero", ["h"], ["nz"], name="nz"),
             helper.make_node("Shape", ["nz"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("ReduceSum", ["sf"], ["c"], keepdims=1, name="sum"),
             helper.make_node("Add", ["h", "c"], ["y"], name="add")]
    g = helper.make_graph(nodes, "nz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [w])
    return helper.make_model(g, opset_imports=OPSET, ir_version=IR_VERSION)


def matmul_model(name: str, rows: int = 1, relu: bool = False) -> onnx.ModelProto:
    """Two inputs, two outputs: z = x @ W + y and Relu(z) or 2 * z. Every variant uses the same W,
    so two of them compiled into one context can share it."""
    w = numpy_helper.from_array(SHARED_WEIGHT, "W")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    aux = (helper.make_node("Relu", ["z"], ["aux"]) if relu
           else helper.make_node("Mul", ["z", "two"], ["aux"]))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "y"], ["z"]), aux],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 64]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 32])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [rows, 32]),
         helper.make_tensor_value_info("aux", TensorProto.FLOAT, [rows, 32])],
        [w, two],
    )
    return helper.make_model(graph, opset_imports=OPSET, ir_version=IR_VERSION)


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }


class _Reader(CalibrationDataReader):
    def __init__(self, model: onnx.ModelProto) -> None:
        self._data = iter([random_inputs(model, seed) for seed in range(4)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._data, None)


def quantize_model(model: onnx.ModelProto, out: Path) -> Path:
    """QDQ with uint16 activations and uint8 weights, the usual HTP choice."""
    cfg = get_qnn_qdq_config(model, _Reader(model), activation_type=QuantType.QUInt16,
                             weight_type=QuantType.QUInt8)
    quantize(model, str(out), cfg)
    return out


def compile_model(qdq: Path, out: Path, *, embed: bool = False, cpu_fallback: bool = False,
                  config: dict[str, str] | None = None, **provider_options: str) -> Path:
    """`out` is the `_ctx.onnx`; the EP writes `<out stem>_qnn.bin` next to it unless embedded.
    Without CPU fallback (ctxbuild's default) the EP keeps graph-I/O Q/DQ inside the QNN graph;
    with it they run on the CPU and the QNN graph gets quantized I/O."""
    toolchain.compile_model(qdq, out, provider_options or TARGET, embed=embed,
                            cpu_fallback=cpu_fallback, config=config)
    return out


def bin_of(ctx: Path) -> Path:
    return ctx.with_name(f"{ctx.stem}_qnn.bin")


@dataclass(frozen=True)
class Built:
    conv_ctx: Path  # ctxbuild-style: float I/O in the QNN graph
    conv_embed_ctx: Path
    mm_ctx: Path  # CPU fallback: UFIXED_POINT_16 I/O in the QNN graph
    shared_ctxs: tuple[Path, Path]  # two graphs in one weight-shared context
    multi_soc_ctx: Path  # one container for SC8380XP/v73 and SM8750/v79


def build_models(root: Path) -> Built:
    """Quantize and compile every test model into `root` (about a second in all)."""
    (root / "embed").mkdir()
    conv = quantize_model(conv_model(), root / "conv.qdq.onnx")
    mm = quantize_model(matmul_model("mm"), root / "mm.qdq.onnx")
    mm_a = quantize_model(matmul_model("mm_a"), root / "mm_a.qdq.onnx")
    mm_b = quantize_model(matmul_model("mm_b", rows=4, relu=True), root / "mm_b.qdq.onnx")
    # Weight sharing: one process, the EP kept registered, the stop flag on the group's last model.
    share = {"ep.share_ep_contexts": "1"}
    shared = (compile_model(mm_a, root / "mm_a_ctx.onnx", config=share),
              compile_model(mm_b, root / "mm_b_ctx.onnx",
                            config={**share, "ep.stop_share_ep_contexts": "1"}))
    return Built(
        conv_ctx=compile_model(conv, root / "conv_ctx.onnx"),
        conv_embed_ctx=compile_model(conv, root / "embed" / "conv_ctx.onnx", embed=True),
        mm_ctx=compile_model(mm, root / "mm_ctx.onnx", cpu_fallback=True),
        shared_ctxs=shared,
        multi_soc_ctx=compile_model(conv, root / "multi_ctx.onnx", soc_model="60,69",
                                    htp_arch="73,79"),
    )


def qnn_session(ctx_model: Path, *, cpu_fallback: bool = False, **provider_options: str) -> ort.InferenceSession:
    """A session on the QNN EP: the x86 HTP simulator. Single-SoC, single-graph contexts only: it
    segfaults on multi-graph ones and refuses multi-SoC containers."""
    return ort.InferenceSession(str(ctx_model), toolchain.session_options(provider_options, cpu_fallback=cpu_fallback))


def run(model: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run on the simulator, CPU fallback on (for wrapper-side Q/DQ)."""
    return qnn_session(model, cpu_fallback=True).run(None, feeds)


def cpu_run(model: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
