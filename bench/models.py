"""Benchmark models: mid-sized CNNs (different seeds, so no work is shared) with calibration samples."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 160
CHANNELS = (32, 64, 96, 128, 160)


def cnn(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, prev, c_in = [], [], "image", 3
    for i, c in enumerate(CHANNELS):
        w = (rng.standard_normal((c, c_in, 3, 3)) * np.sqrt(2 / (9 * c_in))).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(c, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1],
                                   strides=[2, 2] if i else [1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev, c_in = f"r{i}", c
    inits.append(numpy_helper.from_array((rng.standard_normal((c_in, 100)) * 0.05).astype(np.float32), "wf"))
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
              helper.make_node("MatMul", ["f", "wf"], ["logits"])]
    g = helper.make_graph(nodes, "bench_cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                             [1, 3, SIZE, SIZE])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 100])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def write_tree(root: Path, n: int, targets: list[str], samples: int = 4) -> Path:
    """root/recipes/m{i}.yaml + models + calibration; returns the recipes dir."""
    rec = root / "recipes"
    (rec / "models").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    for i in range(n):
        onnx.save(cnn(100 + i), rec / "models" / f"m{i}.onnx")
        cal = rec / "models" / f"cal{i}"
        cal.mkdir(exist_ok=True)
        for s in range(samples):
            np.savez(cal / f"s{s}.npz", image=rng.random((1, 3, SIZE, SIZE), dtype=np.float32))
        (rec / f"m{i}.yaml").write_text(
            f"model: models/m{i}.onnx\nprecision: w8a16\ncalibration: {{dir: models/cal{i}}}\n"
            f"targets: [{', '.join(targets)}]\n")
    return rec
