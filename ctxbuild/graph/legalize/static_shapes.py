"""Shape of a tensor whose shape is fixed -> a constant, and the integer arithmetic on it (Cast, Slice, Concat,
Gather, ...) -> constants: QNN has no Shape on the HTP and takes a Reshape's shape as a constant only. prepare's
optimizer folds these for float models; a QDQ model skips the optimizer (it would fold the weights'
DequantizeLinear), so its Shape chains reach QNN (a quantize_static PP-OCR classifier: Shape -> Cast -> Slice ->
Concat -> Reshape), and a Reshape shaped by one hides the shapes after it from onnx's shape inference.

Exact once prepare has fixed the input shapes: the constants are what onnxruntime's CPU EP computes from them.
Only nodes reached from such a Shape whose inputs are all constants are folded; QuantizeLinear and
DequantizeLinear never are."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView, static_shapes_of

NAME = "static_shapes"
OPS = ("Shape",)
WHAT = "Shape of a fixed-shape tensor and the integer ops on it -> constants"
KEEP = ("QuantizeLinear", "DequantizeLinear")
MAX_ELEMENTS = 1 << 16  # a shape chain's constants are small: larger inputs are weights, left for their ops


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    while n := _fold(g, shapes):
        # A Reshape whose shape was a Shape chain hid every shape after it from onnx's inference (a PP-OCR
        # recognizer's attention: the second Shape reads the first Reshape's output): infer again and fold on.
        # `shapes` is updated in place, so the rules after this one see the shapes folding made known.
        done += n
        g.prune()
        shapes.update(static_shapes_of(g.model))
    return done


def _fold(g: GraphView, shapes: dict[str, list[int]]) -> int:
    """One pass: fold every Shape whose input's shape is known and what is computed from it; how many Shapes.
    A pass that folds none records the Shapes left and why."""
    fold = _Folder(g)
    unknown = []
    reached: set[str] = set()  # outputs computed from a folded Shape
    for node in g.graph.node:  # topological: a node's inputs are known when it is reached
        if node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
            if node.input[0] not in shapes:
                unknown.append(node)
                continue
            start = next((a.i for a in node.attribute if a.name == "start"), 0)
            end = next((a.i for a in node.attribute if a.name == "end"), None)
            fold.values[node.output[0]] = np.array(shapes[node.input[0]][start:end], np.int64)
            fold.folded.append(node)
        elif not (reached.intersection(node.input) and fold.node(node)):
            continue
        reached.update(node.output)
    for node in fold.folded:
        for o in node.output:
            if o in fold.values and (g.consumers.get(o) or o in g.outputs):
                g.replace_uses(o, g.add_const(f"{o}_const", fold.values[o]))
    shapes_folded = sum(n.op_type == "Shape" for n in fold.folded)
    if not shapes_folded:
        for node in unknown:
            g.keep(node, f"the shape of '{node.input[0]}' is not known statically")
    return shapes_folded


class _Folder:
    """Values of small constant expressions, computed on onnxruntime's CPU EP node by node."""

    def __init__(self, g: GraphView) -> None:
        self.g = g
        self.values: dict[str, np.ndarray] = {}
        self.folded: list[Any] = []

    def value(self, name: str) -> np.ndarray | None:
        """The tensor's value if it is a small constant or computed from small constants alone."""
        if name not in self.values:
            value = self.g.const(name)
            if value is not None and value.size <= MAX_ELEMENTS:
                self.values[name] = value
            elif value is None and (producer := self.g.producer.get(name)) is not None:
                self.node(producer)
        return self.values.get(name)

    def node(self, node: Any) -> bool:
        """Fold `node` when its inputs are known; whether it was."""
        if node.domain not in ("", "ai.onnx") or node.op_type in KEEP or node.op_type == "Shape" or not node.input:
            return False
        if any(self.value(i) is None for i in node.input if i):
            return False
        self.values.update(zip(node.output, _run(self.g, node, self.values)))
        self.folded.append(node)
        return True


def _run(g: GraphView, node: Any, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The node's outputs on onnxruntime's CPU EP from its constant inputs."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(values[i], i) for i in dict.fromkeys(i for i in node.input if i)]
    graph = helper.make_graph([node], "fold", [], [helper.make_empty_tensor_value_info(o) for o in node.output if o],
                              inits)
    model = helper.make_model(graph, opset_imports=g.model.opset_import, ir_version=g.model.ir_version)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, {}))
