"""Graph outputs made by a final Concat: find them, cut the Concat off before compiling, re-join after.

A detector head that concatenates box coordinates (0-320) and class scores (0-1) into one output gets
one quantization scale for both: the scores end up a few quantization steps wide. Cut off, each part is
its own graph output with its own scale (the quantizer already calibrated every Concat input on its own),
and the wrapper model joins the parts again with a Concat that onnxruntime runs on the CPU after the
EPContext node: callers see the original output, name and shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxbuild.errors import ActionError

# Between the Concat and the graph output a QDQ model has QuantizeLinear -> DequantizeLinear.
_PASS_THROUGH = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True)
class Join:
    output: str  # the original graph output
    parts: tuple[str, ...]  # tensors the Concat joined, in order: graph outputs of the cut model
    axis: int
    sizes: tuple[int, ...]  # each part's extent along `axis` (0: unknown)


def concat_outputs(model: Any) -> dict[str, Join]:
    """Graph outputs produced by a Concat (through Q/DQ only), with the Concat's parts. Needs no shapes
    beyond what shape inference finds; parts whose sizes are unknown get size 0."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = _shapes(inferred)
    producer = {o: n for n in model.graph.node for o in n.output}
    joins: dict[str, Join] = {}
    for out in model.graph.output:
        node = producer.get(out.name)
        while node is not None and node.op_type in _PASS_THROUGH:
            node = producer.get(node.input[0])
        if node is None or node.op_type != "Concat" or len(node.input) < 2:
            continue
        axis = next(a.i for a in node.attribute if a.name == "axis")
        rank = len(shapes.get(out.name, ()))
        if axis < 0 and rank:
            axis += rank
        sizes = tuple(_dim(shapes.get(p), axis) for p in node.input)
        joins[out.name] = Join(out.name, tuple(node.input), axis, sizes)
    return joins


def _producer_op(model: Any, tensor: str) -> str:
    """The op type computing `tensor` ('input' for a graph input)."""
    return next((n.op_type for n in model.graph.node if tensor in n.output), "input")


def _shapes(model: Any) -> dict[str, tuple[int, ...]]:
    vis = list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)
    return {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in vis
            if v.type.tensor_type.HasField("shape")}


def _dim(shape: tuple[int, ...] | None, axis: int) -> int:
    return shape[axis] if shape and 0 <= axis < len(shape) else 0


def cut(model: Any, outputs: list[str] | None) -> tuple[Any, list[Join]]:
    """The model with the final Concat of `outputs` (None: every output a Concat makes) removed; its
    parts become graph outputs. Returns the new model and what to re-join."""
    import onnx

    joins = concat_outputs(model)
    if outputs is not None:
        missing = [o for o in outputs if o not in joins]
        if missing:
            raise ActionError(f"compile.split_outputs names {', '.join(missing)}, which no final Concat produces "
                              f"(outputs made by a Concat: {', '.join(joins) or 'none'})",
                              "list only outputs whose last op is a Concat, or use split_outputs: true")
        joins = {o: joins[o] for o in outputs}
    if not joins:  # split_outputs: true on a model whose outputs no final Concat makes: it would change nothing
        outs = ", ".join(f"'{o.name}' ({_producer_op(model, o.name)})" for o in model.graph.output)
        raise ActionError(f"compile.split_outputs: true, but no output is made by a final Concat: nothing to split "
                          f"(outputs: {outs})", "remove compile.split_outputs: it changes nothing for this model")
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    drop: set[int] = set()
    for j in joins.values():
        node = producer[j.output]
        while True:  # the Concat and the Q/DQ after it, unless something else reads their outputs
            drop.add(id(node))
            if node.op_type == "Concat":
                break
            node = producer[node.input[0]]
            if consumers.get(node.output[0], 0) > 1:
                raise ActionError(f"output '{j.output}': the tensor '{node.output[0]}' before it is read by other "
                                  "nodes too; cannot cut the Concat off", "drop this output from split_outputs")
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(n for n in model.graph.node if id(n) not in drop)
    existing = {o.name for o in model.graph.output}
    outs = []
    for o in model.graph.output:
        if o.name not in joins:
            outs.append(o)
            continue
        for p in joins[o.name].parts:
            if p not in infos and (info := _dequantized_info(p, producer, infos)) is not None:
                infos[p] = info
            if p in existing or p not in infos:
                raise ActionError(f"output '{o.name}': part '{p}' of its Concat is already a graph output or has "
                                  "no known type", "drop this output from split_outputs")
            existing.add(p)
            outs.append(infos[p])
    del new.graph.output[:]
    new.graph.output.extend(outs)
    return new, list(joins.values())


def _dequantized_info(name: str, producer: dict[str, Any], infos: dict[str, Any]) -> Any:
    """A float DequantizeLinear output onnx's shape inference left untyped: the 16-bit Q/DQ pairs onnxruntime's
    quantizer writes are com.microsoft ops, which onnx does not infer (seen on a public YOLOv8). Q/DQ keep the
    shape: the float tensor before the QuantizeLinear gives it."""
    from onnx import TensorProto, helper

    dq = producer.get(name)
    q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
    before = infos.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None
    if before is None or before.type.tensor_type.elem_type != TensorProto.FLOAT:
        return None
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in before.type.tensor_type.shape.dim]
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def rejoin(wrapper: Any, original: Any, joins: list[Join]) -> Any:
    """Add a CPU Concat after the EPContext node per join; graph outputs in the original's order and types."""
    from onnx import helper

    if not joins:
        return wrapper
    by_out = {j.output: j for j in joins}
    for j in joins:
        wrapper.graph.node.append(helper.make_node("Concat", list(j.parts), [j.output], name=f"{j.output}__rejoin",
                                                   axis=j.axis))
    originals = {o.name: o for o in original.graph.output}
    have = {o.name: o for o in wrapper.graph.output}
    outs = [originals[o.name] if o.name in by_out else have[o.name] for o in original.graph.output]
    # The parts stay typed: onnxruntime infers the EPContext node's output types from them.
    wrapper.graph.value_info.extend(have[p] for j in joins for p in j.parts)
    del wrapper.graph.output[:]
    wrapper.graph.output.extend(outs)
    if not any(op.domain in ("", "ai.onnx") for op in wrapper.opset_import):
        wrapper.opset_import.append(helper.make_opsetid("", 13))
    return wrapper
