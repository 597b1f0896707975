"""An editable view of an ONNX graph for the legalization rules: producers, consumers, constants, fresh names.

The rules only ever add nodes and rewire consumers; `prune` then drops what no output needs, so a rule never
has to prove a node dead itself. A rule that finds its pattern but not a condition its rewrite is exact under
leaves the node as written and says why (`keep`): legalize records it."""
from __future__ import annotations

from typing import Any

import numpy as np


class GraphView:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self._names = {n.name for n in self.graph.node} | {t for n in self.graph.node for t in n.output}
        self._names |= {i.name for i in self.graph.initializer} | {i.name for i in self.graph.input}
        self.kept: list[str] = []  # "'node' (Op): why", for the patterns left as written
        self.reindex()

    def replace(self, model: Any) -> None:
        """The model becomes `model` (a converted copy), in place: the caller's ModelProto is the one edited."""
        self.model.CopyFrom(model)
        self.__init__(self.model)  # type: ignore[misc]

    def reindex(self) -> None:
        self.inits = {i.name: i for i in self.graph.initializer}
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in self.graph.output}

    def keep(self, node: Any, why: str) -> None:
        """`node` matches a rule's pattern but not a condition of its exactness: left as written, for `why`."""
        self.kept.append(f"'{node.name or node.output[0]}' ({node.op_type}): {why}")

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def const(self, name: str) -> np.ndarray | None:
        """The value of an initializer (or a Constant node's tensor), else None: a runtime tensor."""
        from onnx import numpy_helper

        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            attr = next((a for a in node.attribute if a.name == "value"), None)
            return numpy_helper.to_array(attr.t) if attr is not None else None
        return None

    def const_type(self, name: str) -> int | None:
        """The TensorProto data type of an initializer (or a Constant node's tensor), read without its data (which
        may be external), else None: a runtime tensor."""
        if name in self.inits:
            return self.inits[name].data_type
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            attr = next((a for a in node.attribute if a.name == "value"), None)
            return attr.t.data_type if attr is not None else None
        return None

    def squared(self, node: Any) -> str | None:
        """x, when `node` is Mul(x, x) or Pow(x, 2)."""
        if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
            return node.input[0]
        if node.op_type == "Pow":
            two = self.const(node.input[1])
            if two is not None and two.size == 1 and float(two.item()) == 2.0:
                return node.input[0]
        return None

    def add_const(self, base: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], base: str, *, outputs: list[str] | None = None, **attrs: Any) -> Any:
        """Append a node; returns it. `outputs` default to one fresh name derived from `base`."""
        from onnx import helper

        outs = outputs if outputs is not None else [self.fresh(f"{base}_out")]
        n = helper.make_node(op, inputs, outs, name=self.fresh(base), **attrs)
        self.graph.node.append(n)
        return n

    def unsqueeze(self, x: str, axes: list[int], base: str) -> str:
        if self.opset >= 13:
            return self.node("Unsqueeze", [x, self.add_const(f"{base}_axes", np.array(axes, np.int64))], base).output[0]
        return self.node("Unsqueeze", [x], base, axes=axes).output[0]

    def reduce_axes(self, node: Any) -> list[int] | None | bool:
        """A Reduce node's axes (None: all of them), or False when they are a runtime tensor or none are given
        with noop_with_empty_axes set (the reduce is then the identity)."""
        attr = self.attr(node, "axes", None)
        if attr is not None:
            return [int(a) for a in attr] or None
        if len(node.input) > 1 and node.input[1]:
            value = self.const(node.input[1])
            if value is None:
                return False
            if value.size:
                return [int(a) for a in value.ravel()]
        return False if self.attr(node, "noop_with_empty_axes", 0) else None

    def reduce_sum(self, x: str, axes: list[int] | None, keepdims: int, base: str) -> str:
        """ReduceSum(x) over `axes` (None: all), in the form of the graph's opset (axes an input from 13 on)."""
        if axes is None:
            return self.node("ReduceSum", [x], base, keepdims=keepdims).output[0]
        if self.opset >= 13:
            axes_in = self.add_const(f"{base}_axes", np.array(axes, np.int64))
            return self.node("ReduceSum", [x, axes_in], base, keepdims=keepdims).output[0]
        return self.node("ReduceSum", [x], base, axes=axes, keepdims=keepdims).output[0]

    @staticmethod
    def attr(node: Any, name: str, default: Any) -> Any:
        from onnx import helper

        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)

    def replace_uses(self, old: str, new: str) -> None:
        """Every consumer of `old` (and the graph output of that name) reads `new` instead."""
        for n in self.graph.node:
            for k, i in enumerate(n.input):
                if i == old:
                    n.input[k] = new
        if old in self.outputs:  # keep the graph's output name: the old producer's output goes dead
            producer = self.producer[old]
            producer.output[list(producer.output).index(old)] = self.fresh(f"{old}_replaced")
            self.node("Identity", [new], f"{old}_keep", outputs=[old])

    def prune(self) -> None:
        """Drop nodes no graph output depends on, then initializers nothing reads; keep the order topological."""
        nodes = self._toposort(list(self.graph.node))  # appended nodes first move after what they read
        needed = set(self.outputs)
        keep = []
        for n in reversed(nodes):
            if any(o in needed for o in n.output if o):
                keep.append(n)
                needed.update(i for i in n.input if i)
                needed.update(_subgraph_inputs(n))
        _set_nodes(self.graph, list(reversed(keep)))
        used = needed | {i.name for i in self.graph.input}
        kept = [t for t in self.graph.initializer if t.name in used]
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept)
        self.reindex()

    def _toposort(self, nodes: list[Any]) -> list[Any]:
        """Added nodes were appended at the end; order them after what they read (Kahn's, stable)."""
        have = {i.name for i in self.graph.input} | {t.name for t in self.graph.initializer} | {""}
        done: list[Any] = []
        pending = nodes
        while pending:
            rest = []
            for n in pending:
                if all(i in have for i in n.input):
                    done.append(n)
                    have.update(n.output)
                else:
                    rest.append(n)
            if len(rest) == len(pending):  # outer-scope names used by subgraphs: keep their order as is
                done.extend(rest)
                break
            pending = rest
        return done


def static_shapes_of(model: Any) -> dict[str, list[int]]:
    """Static tensor shapes from onnx's shape inference (with data propagation for Shape chains)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is a help here, not a requirement: rules needing a shape skip
        return {}
    return inferred_shapes(inferred)


def inferred_shapes(model: Any) -> dict[str, list[int]]:
    """The static shapes `model`'s value_info, inputs and outputs record (shape inference already run)."""
    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = [d.dim_value for d in t.shape.dim]
    return shapes


def _subgraph_inputs(node: Any) -> set[str]:
    names: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                names.update(n.input)
    return names


def _set_nodes(graph: Any, nodes: list[Any]) -> None:
    copies = [type(n)() for n in nodes]
    for c, n in zip(copies, nodes):
        c.CopyFrom(n)
    del graph.node[:]
    graph.node.extend(copies)
