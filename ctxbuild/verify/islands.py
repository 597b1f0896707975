"""fp16 islands: which `quantization.nodes` fp16 pins change nothing, and the neighbour that makes one change
something. A node left out of quantization keeps in float only the tensors no quantized node reads or writes: a
weightless node between quantized nodes still gets a DequantizeLinear on its input and a QuantizeLinear on its
output, which QNN runs as one quantized op, so the QDQ model is the unpinned one to the byte. Pinned with a
neighbour, the tensor between them stays float and the HTP runs both in fp16. The mixed rung (culprits.py) and the
diagnosis' hints (advice.py) pin that neighbour with it; quantize's warning checks the QDQ model it made
(runs_quantized)."""
from __future__ import annotations

from typing import Any

from ctxbuild.graph.nodenames import Names, key
from ctxbuild.recipes.quantization import FP16_NODE


def lone_pins(model: Any, nodes: dict[str, Any]) -> list[str]:
    """The fp16 pins of `nodes` (the user's names) that would change nothing in `model` (the prepared model): every
    node a pin stands for is weightless (no float initializer), reads only tensors quantized nodes compute (or graph
    inputs a quantized node reads too) and writes only tensors quantized nodes alone read (no graph output). The
    quantizer then puts a DequantizeLinear before and a QuantizeLinear after it, which QNN runs as one quantized op
    (runs_quantized finds the same in the QDQ model): the binary is the unpinned one to the byte.
    Where a neighbour is an op the quantizer leaves in float this says lone too: pinning one more node costs little."""
    g = _Graph(model, nodes)
    return [pin for pin, found in g.fp16.items() if found and all(g.quantized_between(k) for k in found)]


def widen_lone(model: Any, nodes: dict[str, Any], worst: list[dict[str, Any]], side: str) -> tuple[dict[str, Any],
                                                                                                 dict[str, str]]:
    """(quantization.nodes, {lone pin: the neighbour pinned with it}): each fp16 pin that would change nothing
    (lone_pins) gets a neighbour in fp16 too, so the tensor between them stays float and the HTP runs both in fp16:
    the neighbour the diagnosis' rows (`worst`, by `side`'s added dB) rate worst, else the node computing its first
    input (a node's noise is mostly its input's, amplified). Without it the mixed candidate would be the base to the
    byte, and a verify would measure the base again (PP-OCR's direction classifier: a lone HardSigmoid)."""
    rank = {r["node"]: r[side] for r in worst if r.get(side) is not None}
    nodes, widened = dict(nodes), {}
    for pin in lone_pins(model, nodes):
        g = _Graph(model, nodes)  # with the neighbours pinned so far
        if not all(g.quantized_between(k) for k in g.fp16[pin]):
            continue  # an earlier pin's neighbour is this one's too
        near = [n for k in g.fp16[pin] for n in g.neighbours(k) if n not in nodes]
        if near:
            pick = max(near, key=lambda n: rank.get(n, float("-inf"))) if any(n in rank for n in near) else near[0]
            nodes[pick] = FP16_NODE
            widened[pin] = pick
    return dict(sorted(nodes.items())), widened


class _Graph:
    """The prepared model's tensors around the nodes `nodes`' fp16 pins stand for (by nodenames.key)."""

    def __init__(self, model: Any, nodes: dict[str, Any]) -> None:
        import onnx

        self.names = Names(model)
        self.fp16 = {n: self.names.resolve(n) or [] for n, o in nodes.items() if o == FP16_NODE}
        self.floated = {k for found in self.fp16.values() for k in found}
        g = model.graph
        self.by_key = {key(n): n for n in g.node}
        self.producer = {o: key(n) for n in g.node for o in n.output}
        self.readers: dict[str, list[str]] = {}
        for n in g.node:
            for t in n.input:
                self.readers.setdefault(t, []).append(key(n))
        self.inits = {i.name: i.data_type for i in g.initializer}
        self.float_init = {t for t, dt in self.inits.items() if dt == onnx.TensorProto.FLOAT}
        self.inputs = {i.name for i in g.input}
        self.outputs = {o.name for o in g.output}

    def quantized_between(self, k: str) -> bool:
        """Node `k` would sit between a DequantizeLinear on each input and QuantizeLinear nodes alone on each output."""
        node = self.by_key.get(k)
        if node is None:
            return False
        for t in filter(None, node.input):
            if t in self.float_init:
                return False  # its own float weight stays float: it runs in fp16
            if t in self.inits:
                continue
            # a graph input is quantized when a quantized node reads it too; else what computes it must be quantized
            quantized = (any(r not in self.floated for r in self.readers[t]) if t in self.inputs
                         else t in self.producer and self.producer[t] not in self.floated)
            if not quantized:
                return False
        return all(o not in self.outputs and self.readers.get(o) and not set(self.readers[o]) & self.floated
                   for o in filter(None, node.output))

    def neighbours(self, k: str) -> list[str]:
        """The user's names of the nodes computing `k`'s inputs, then of those reading its outputs."""
        node = self.by_key[k]
        up = [self.producer[t] for t in node.input if t in self.producer]
        down = [r for o in node.output for r in self.readers.get(o, [])]
        return list(dict.fromkeys(self.names.user(n) for n in up + down))


def runs_quantized(qdq: Any, pins: dict[str, list[str]]) -> list[str]:
    """The pins (name -> the QDQ model's nodes it resolved to) whose nodes all sit between a DequantizeLinear on each
    float input and QuantizeLinear nodes alone on each output: QNN takes DequantizeLinear -> op -> QuantizeLinear as
    one quantized op, so leaving the op out of quantization (fp16) changed nothing. A float weight, a graph input or
    output, or a neighbour pinned too keeps a tensor float: the op runs in fp16 then."""
    import onnx

    producer = {o: n.op_type for n in qdq.graph.node for o in n.output}
    readers: dict[str, list[str]] = {}
    for n in qdq.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n.op_type)
    non_float = {i.name for i in qdq.graph.initializer if i.data_type != onnx.TensorProto.FLOAT}
    outputs = {o.name for o in qdq.graph.output}
    by_name = {n.name: n for n in qdq.graph.node}

    def quantized(node: Any) -> bool:
        return (all(producer.get(t) == "DequantizeLinear" or t in non_float for t in node.input if t)
                and all(o not in outputs and set(readers.get(o, [])) == {"QuantizeLinear"} for o in node.output if o))

    return [pin for pin, found in pins.items()
            if found and all(p in by_name and quantized(by_name[p]) for p in found)]
