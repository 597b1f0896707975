"""A small YOLO-style detector whose single output concatenates a box branch (0-320) and a score branch (0-1)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BOXES, SCORES, CELLS = 4, 6, 256  # output [1, BOXES + SCORES, CELLS]


def sliced_detector(width: int = 8) -> onnx.ModelProto:
    """`width` stem channels: 64 makes weights big enough for onnx to put them in external data."""
    rng = np.random.default_rng(0)

    def w(name: str, shape: tuple[int, ...], s: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [w("w1", (width, 3, 3, 3)), w("b1", (width,), 0.05), w("wb", (BOXES, width, 1, 1)), w("bb", (BOXES,), 0.1),
             w("ws", (SCORES, width, 1, 1)), w("bs", (SCORES,), 0.1),
             numpy_helper.from_array(np.array([320.0], np.float32), "k"),
             numpy_helper.from_array(np.array([1, BOXES, -1], np.int64), "box_shape"),
             numpy_helper.from_array(np.array([1, SCORES, -1], np.int64), "score_shape")]
    nodes = [helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="stem", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"], name="stem_relu"),
             helper.make_node("Conv", ["r1", "wb", "bb"], ["cb"], name="box_conv"),
             helper.make_node("Sigmoid", ["cb"], ["box_unit"], name="box_sigmoid"),
             helper.make_node("Mul", ["box_unit", "k"], ["boxes"], name="box_scale"),
             helper.make_node("Reshape", ["boxes", "box_shape"], ["boxes_flat"], name="box_flat"),
             helper.make_node("Conv", ["r1", "ws", "bs"], ["cs"], name="score_conv"),
             helper.make_node("Sigmoid", ["cs"], ["scores"], name="score_sigmoid"),
             helper.make_node("Reshape", ["scores", "score_shape"], ["scores_flat"], name="score_flat"),
             helper.make_node("Concat", ["boxes_flat", "scores_flat"], ["detections"], name="head_concat", axis=1)]
    graph = helper.make_graph(nodes, "sliced_det", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("detections", TensorProto.FLOAT, [1, BOXES + SCORES, CELLS])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def write_tree(root: Path, recipes: dict[str, str], width: int = 8) -> Path:
    """root/det.onnx, root/cal/*.npz and one recipe per entry (name -> extra YAML lines)."""
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(sliced_detector(width), root / "det.onnx")
    rng = np.random.default_rng(1)
    (root / "cal").mkdir(exist_ok=True)
    for i in range(4):
        np.savez(root / "cal" / f"s{i}.npz", image=rng.random((1, 3, 32, 32)).astype(np.float32))
    for name, extra in recipes.items():
        (root / f"{name}.yaml").write_text("model: det.onnx\nprecision: w8a8\ncalibration: {dir: cal}\n"
                                           "targets: [SM8650]\n" + extra)
    return root
