"""RMSNorm written out (Pow(x, 2) -> ReduceMean -> Add eps -> Sqrt -> Div -> Mul) -> SimplifiedLayerNormalization.

Not an op the HTP refuses, an op it gets wrong in fp16: T5-style residual streams reach ~6e4 and their
square overflows fp16 (a T5 encoder verified at cosine -0.003 on the simulator). The fused op is QNN's RmsNorm,
which the EP maps whole; it is onnxruntime's (its transformer optimizer fuses the same patterns). The op
normalizes over every axis from `axis` on, so only a mean over the last axis alone is fused (one over channels of
a [N, C, T] tensor would become one over channels and time), with a scale of one value per element of that axis,
and only when nothing else reads the pattern's intermediate values. A LayerNorm written out has the same tail
after its mean is subtracted; those are left alone: centred values do not overflow, and the quantizer's opset
conversion knows no SimplifiedLayerNormalization (a ViT at int16 would stop there)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "rmsnorm"
OPS = ("ReduceMean",)
WHAT = "RMSNorm written out with Pow/ReduceMean/Sqrt -> SimplifiedLayerNormalization (fp16 overflow)"


def wanted(g: GraphView) -> bool:
    """A ReduceMean of a square (Pow, or Mul(x, x)) of an input that is not centred, then Add and Sqrt."""
    return any(_square_root(g, mean) is not None for mean in g.graph.node if mean.op_type == "ReduceMean")


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for mean in [n for n in g.graph.node if n.op_type == "ReduceMean"]:
        match = _match(g, mean)
        if match is None:
            continue
        x, eps, scale, nodes = match
        why = _inexact(g, mean, x, scale, nodes, shapes)
        if why:
            g.keep(mean, why)
            continue
        y = g.node("SimplifiedLayerNormalization", [x, scale], f"{mean.name or 'rmsnorm'}_rmsnorm", axis=-1,
                   epsilon=eps, stash_type=1).output[0]
        g.replace_uses(nodes[-1].output[0], y)
        done += 1
    if done:
        g.reindex()
    return done


def _square_root(g: GraphView, mean: Any) -> tuple[Any, Any] | None:
    """(the square, the Sqrt) around `mean` = ReduceMean(x*x) -> Add -> Sqrt, x not centred; else None."""
    sq = g.producer.get(mean.input[0])
    if sq is None or g.squared(sq) is None or _centred(sq.input[0], g.producer):
        return None
    add = _only_use(g, mean.output[0], "Add")
    sqrt = _only_use(g, add.output[0], "Sqrt") if add is not None else None
    return (sq, sqrt) if sqrt is not None else None


def _match(g: GraphView, mean: Any) -> tuple[str, float, str, list[Any]] | None:
    """The pattern onnxruntime's fusion knows, from its ReduceMean: (x, epsilon, scale, its nodes in order, the
    last one's output the result), else None. Tails: Div(1, rms) or Reciprocal(rms), then Mul(x, .); or Div(x, rms);
    then Mul(., scale)."""
    found = _square_root(g, mean)
    if found is None:
        return None
    sq, sqrt = found
    x = sq.input[0]
    add = g.consumers[mean.output[0]][0]
    eps = _other_const(g, add, mean.output[0])
    if eps is None or eps.size != 1 or not 0 <= float(eps.item()) < np.inf:
        return None
    tail = [_only_use(g, sqrt.output[0], op) for op in ("Div", "Reciprocal")]
    div = tail[0] or tail[1]
    if div is None:
        return None
    chain = [sq, mean, add, sqrt, div]
    if div.op_type == "Div" and list(div.input) == [x, sqrt.output[0]]:
        normed = div
    else:
        one = _other_const(g, div, sqrt.output[0]) if div.op_type == "Div" else np.ones(())
        normed = _only_use(g, div.output[0], "Mul")
        if one is None or one.size != 1 or float(one.item()) != 1.0 or div.input[-1] != sqrt.output[0] or \
                normed is None or x not in normed.input:
            return None
        chain.append(normed)
    out = _only_use(g, normed.output[0], "Mul")
    if out is None:
        return None
    scale = next((i for i in out.input if i != normed.output[0]), None)
    return (x, float(eps.item()), scale, chain + [out]) if scale is not None else None


def _inexact(g: GraphView, mean: Any, x: str, scale: str, nodes: list[Any], shapes: dict[str, list[int]]) -> str | None:
    """Why fusing this RMSNorm into SimplifiedLayerNormalization(axis=-1) would change what it computes, or None."""
    from onnx import helper

    shape = shapes.get(x)
    if shape is None:
        return "the input's shape is not known statically"
    attrs = {a.name: helper.get_attribute_value(a) for a in mean.attribute}
    axes = attrs.get("axes")
    if axes is None and len(mean.input) > 1 and mean.input[1]:
        value = g.const(mean.input[1])
        axes = None if value is None else [int(a) for a in value.ravel()]
    if axes is None or sorted(a % len(shape) for a in axes) != [len(shape) - 1]:
        return f"the mean is over axes {axes if axes is not None else 'all'} of {shape}, not the last one alone"
    if not attrs.get("keepdims", 1):
        return "the mean drops the reduced axis (keepdims=0)"
    if scale in g.inits:  # its dims, not its data: a decoder's norm weights may be external and not loaded
        scale_shape = list(g.inits[scale].dims)
    else:
        value = g.const(scale)
        scale_shape = list(value.shape) if value is not None else shapes.get(scale)
    if scale_shape != shape[-1:]:
        return f"the scale's shape {scale_shape} is not [{shape[-1]}], one value per element of the last axis"
    inside = {o for n in nodes[:-1] for o in n.output}
    if any(o in g.outputs or any(u not in nodes for u in g.consumers.get(o, [])) for o in inside):
        return "a value inside the pattern is read elsewhere too"
    return None


def _only_use(g: GraphView, name: str, op: str) -> Any | None:
    uses = g.consumers.get(name, [])
    return uses[0] if len(uses) == 1 and uses[0].op_type == op else None


def _other_const(g: GraphView, node: Any, name: str) -> np.ndarray | None:
    """The constant value of `node`'s other input (a binary op reading `name`), or None."""
    others = [i for i in node.input if i != name]
    return g.const(others[0]) if len(others) == 1 else None


def _centred(name: str, producer: dict) -> bool:
    """`name` = Sub(x, ReduceMean(x)), perhaps moved by a Transpose the optimizer put there: centred."""
    sub = producer.get(name)
    while sub is not None and sub.op_type in ("Transpose", "Reshape"):
        sub = producer.get(sub.input[0])
    if sub is None or sub.op_type != "Sub":
        return False
    mean = producer.get(sub.input[1])
    return mean is not None and mean.op_type == "ReduceMean" and mean.input[0] == sub.input[0]


def unfuse(model: Any) -> dict[str, list[str]]:
    """Write each SimplifiedLayerNormalization out again as plain ops (x / sqrt(mean(x*x) + eps) * scale), in
    place; returns each one's name -> its written-out nodes' (named `<name>/<Op>_<k>`). For the quantizer: it moves
    16-bit models to opset 21 and onnx's converter has no schema for onnxruntime's op, and quantized activations
    have a scale, not fp16's range, so the written-out form does not overflow there (`refuse` puts back the ones
    left in float)."""
    from onnx import helper, numpy_helper

    g = GraphView(model)
    fused = [n for n in g.graph.node if n.op_type == "SimplifiedLayerNormalization" and len(n.output) == 1]
    done: dict[str, list[str]] = {}
    for n in fused:
        attr = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        x, scale, y = n.input[0], n.input[1], n.output[0]
        axis = attr.get("axis", -1)
        if axis >= 0:
            continue  # normalized from a leading axis: not an RMSNorm the rule fuses; the quantizer names it
        axes = list(range(axis, 0))
        eps = g.fresh(f"{n.name}_eps")
        g.graph.initializer.append(numpy_helper.from_array(np.array(attr.get("epsilon", 1e-5), np.float32), eps))
        t = {k: g.fresh(f"{n.name}_{k}") for k in ("sq", "ms", "mse", "rms", "xn")}
        mean = (helper.make_node("ReduceMean", [t["sq"], _axes(g, n.name, axes)], [t["ms"]], keepdims=1)
                if g.opset >= 18 else helper.make_node("ReduceMean", [t["sq"]], [t["ms"]], axes=axes, keepdims=1))
        nodes = [helper.make_node("Mul", [x, x], [t["sq"]]), mean, helper.make_node("Add", [t["ms"], eps], [t["mse"]]),
                 helper.make_node("Sqrt", [t["mse"]], [t["rms"]]), helper.make_node("Div", [x, t["rms"]], [t["xn"]]),
                 helper.make_node("Mul", [t["xn"], scale], [y])]
        for k, node in enumerate(nodes):
            node.name = f"{n.name}/{node.op_type}_{k}"
        at = list(g.graph.node).index(n)
        g.graph.node.remove(n)
        for k, node in enumerate(nodes):
            g.graph.node.insert(at + k, node)
        done[n.name] = [node.name for node in nodes]
    if done:
        g.reindex()
    return done


def refuse(model: Any, fused: list[Any], written: dict[str, list[str]]) -> None:
    """Put the SimplifiedLayerNormalizations `fused` back in place of what `unfuse` wrote out for them (`written`),
    in place, in a QDQ model where the quantizer left those nodes in float (quantization.nodes pinned them at fp16):
    written out, the HTP would compute the square in fp16, the overflow the rule exists for; fused, the EP maps
    the op whole to QNN's RmsNorm, as an fp16 build runs it. The written-out nodes' inputs are the quantized model's
    own (a DequantizeLinear's output for x)."""
    graph = model.graph
    for original in fused:
        by_name = {n.name: n for n in graph.node}
        group = [by_name[name] for name in written[original.name] if name in by_name]
        if len(group) != len(written[original.name]):
            raise ValueError(f"the quantized model lacks nodes of the written-out RMSNorm '{original.name}'")
        first, last = group[0], group[-1]  # x*x, and xn*scale computing the output
        node = type(original)()
        node.CopyFrom(original)
        node.input[:] = [first.input[0], last.input[1]]
        node.output[:] = [last.output[0]]
        at = list(graph.node).index(last)
        graph.node.insert(at + 1, node)
        for n in group:
            graph.node.remove(n)
    read = {i for n in graph.node for i in n.input}
    dead = [t for t in graph.initializer if t.name not in read]
    for t in dead:
        graph.initializer.remove(t)


def _axes(g: GraphView, name: str, axes: list[int]) -> str:
    from onnx import numpy_helper

    t = g.fresh(f"{name}_axes")
    g.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), t))
    return t
