"""Which quantization schemes each HTP arch compiles and runs, measured on the simulator.

A small transformer-ish graph (Conv, MatMul with a weight, LayerNormalization, Softmax, Gemm) is quantized
with onnxruntime's QNN config for every (activation type, weight type, per-channel) combination below,
compiled with the QNN EP for every htp_arch, and run on the HTP simulator. ctxbuild's table of schemes
it accepts per arch (ctxbuild/quant_support.py) is what this printed; rerun it when the toolchain moves.

Usage: python bench/quant_support.py [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ctxbuild.recipes.targets import lookup  # noqa: E402 - after the path insert

# htp_arch -> the soc_model of one phone SoC with it (ctxbuild's SoC table has both)
ARCHES = {str(s.htp_arch): str(s.soc_model)
          for s in map(lookup, ("SM8350", "SM8450", "SM8550", "SM8650", "SM8750", "SM8850")) if s is not None}
SCHEMES = [  # (activation QuantType, weight QuantType, per_channel)
    ("QUInt8", "QUInt8", False), ("QUInt8", "QInt8", True), ("QUInt8", "QUInt8", True),
    ("QUInt16", "QUInt8", False), ("QUInt16", "QUInt8", True), ("QUInt16", "QInt8", True),
    ("QUInt16", "QInt16", False), ("QUInt16", "QInt16", True), ("QUInt16", "QUInt16", False),
    ("QInt16", "QInt16", False), ("QUInt8", "QInt16", False), ("QUInt16", "QInt4", True),
]


def model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name: str, shape: tuple[int, ...], s: float = 0.2) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [init("cw", (8, 3, 3, 3)), init("cb", (8,), 0.05), init("mw", (32, 32)), init("g", (32,), 1.0),
             init("b", (32,), 0.1), init("gw", (32, 10)), init("gb", (10,), 0.05),
             numpy_helper.from_array(np.array([1, 8, 32], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["t"], name="reshape"),
             helper.make_node("MatMul", ["t", "mw"], ["m"], name="matmul"),
             helper.make_node("LayerNormalization", ["m", "g", "b"], ["ln"], name="ln", axis=-1),
             helper.make_node("Softmax", ["ln"], ["sm"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["sm", "gw"], ["mm2"], name="proj"),
             helper.make_node("Add", ["mm2", "gb"], ["y"], name="bias")]
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _try(fn, *args) -> str:
    """Run fn in a forked child (a QNN abort must not end the survey); 'ok' or the error's last line."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            fn(*args)
            send.send("ok")
        except Exception as e:  # noqa: BLE001 - the survey records any failure as text
            send.send((str(e).strip().splitlines() or [type(e).__name__])[-1][:160])

    p = ctx.Process(target=child)
    p.start()
    send.close()
    msg = recv.recv() if recv.poll(120) else "timeout"
    p.join(5)
    if p.exitcode not in (0, None) and msg == "ok":
        msg = f"exit {p.exitcode}"
    return msg


def _quantize(src: Path, dst: Path, act: str, weight: str, per_channel: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    rng = np.random.default_rng(1)
    data = iter([{"x": rng.standard_normal((1, 3, 4, 8)).astype(np.float32)} for _ in range(4)])

    class Reader:
        def get_next(self):
            return next(data, None)

    cfg = get_qnn_qdq_config(str(src), Reader(), activation_type=getattr(QuantType, act),
                             weight_type=getattr(QuantType, weight), per_channel=per_channel)
    quantize(str(src), str(dst), cfg)


def _compile_and_run(qdq: Path, ctx: Path, arch: str) -> None:
    import onnxruntime as ort

    from ctxbuild.toolchain import installed as toolchain

    toolchain.compile_model(qdq, ctx, {"soc_model": ARCHES[arch], "htp_arch": arch}, embed=False, cpu_fallback=False)
    sess = ort.InferenceSession(str(ctx), toolchain.session_options({}, cpu_fallback=False))
    sess.run(None, {"x": np.ones((1, 3, 4, 8), np.float32)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.onnx"
        onnx.save(model(), src)
        for act, weight, pc in SCHEMES:
            label = f"{act}/{weight}{' per-channel' if pc else ''}"
            qdq = Path(tmp) / f"{act}_{weight}_{pc}.qdq.onnx"
            q = _try(_quantize, src, qdq, act, weight, pc)
            row = {}
            for arch in ARCHES:
                ctx = Path(tmp) / f"{qdq.stem}_{arch}_ctx.onnx"
                row[arch] = q if q != "ok" else _try(_compile_and_run, qdq, ctx, arch)
            results[label] = row
            cells = "  ".join(f"v{a}:{'ok' if r == 'ok' else 'FAIL'}" for a, r in row.items())
            print(f"{label:32s} {cells}", flush=True)
            for a, r in row.items():
                if r != "ok":
                    print(f"    v{a}: {r}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
