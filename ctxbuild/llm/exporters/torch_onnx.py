"""optimum / torch.onnx's decoders as exported (`optimum-cli export onnx --task text-generation-with-past`) -> the
canonical form, and what only a static graph's fixed shapes allow.

What torch's exporter writes that the static pass cannot cut or the HTP cannot run, and what it becomes:
- a mask per layer (each attention adds its own Where(Slice(...)) of a boolean mask before its Softmax) -> the one
  canonical mask (emit.py), which the static pass makes an input; the IsNaN guard after each Softmax is dropped
  (it only catches rows masked entirely with -inf; the canonical mask is finite);
- rotary computed at run time (Sin/Cos of position_ids times the inverse frequencies) -> a Gather by position_ids
  from constant tables: the export's own rotary subgraph run by onnxruntime for positions 0 .. CL - 1, so each
  row is what the export computes at run time, to the bit;
- positions computed in the graph when the export takes no `position_ids` (transformers' cache_position,
  arange(past, past + seq): optimum's Gemma) -> a `position_ids` input, the canonical form's: a static graph's
  past length is fixed, its positions are not;
- shape arithmetic (Shape/Gather/Concat/Range/Where/Expand of shapes, ...) -> constants, per static graph, where
  every shape is fixed (`fold_static`); what then passes a tensor through unchanged -> the tensor itself: Identity
  of a weight (torch shares equal initializers that way), Casts to the type it has, whole-shape Slices and empty
  Concat operands (Phi-3's q[..., :rotary] and q[..., rotary:] when the rotary covers the head).
Every rewrite is in ops of the model's own opset (opset 13 and later: Unsqueeze's axes are an input; an older
export is refused at plan time)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.llm.canonical import NotADecoder
from ctxbuild.llm.exporters.base import Exporter
from ctxbuild.llm.exporters.emit import Emit

FOLD_MAX = 1 << 16  # elements: inline initializers up to this size take part in constant folding (not weights)


class TorchOnnx(Exporter):
    """Plain ONNX ops as torch.onnx writes them: run-time Sin/Cos or a mask per layer; `position_ids` given or
    computed from the past length (`_positions`)."""
    name = "optimum / torch.onnx"
    inputs = ("input_ids", "attention_mask")

    @classmethod
    def matches(cls, model: Any) -> bool:
        g = model.graph
        if any(n.op_type in ("Sin", "Cos") for n in g.node):
            return True
        try:  # masks per layer (a shared one is the canonical form already)
            return len({add.input[i] for add, i in _mask_operands(g).values()}) > 1
        except NotADecoder:
            return False

    @classmethod
    def check(cls, model: Any) -> None:
        if _opset(model) < 13:
            raise NotADecoder(f"opset {_opset(model)}: the rewrite of torch.onnx decoders writes opset-13 forms "
                              "(Unsqueeze's axes as an input); export with opset 14 or later (optimum-cli --opset)")
        _mask_operands(model.graph)  # raises naming the attention whose mask it cannot tell from its scores
        if "position_ids" not in {i.name for i in model.graph.input}:
            _positions(model.graph)  # raises if the positions the graph computes cannot be found

    @classmethod
    def to_canonical(cls, model: Any, base_dir: str, positions: int) -> Any:
        g = model.graph
        e = Emit(g)
        if "position_ids" not in {i.name for i in g.input}:
            _take_positions(e, g)
        mask = e.mask()
        producers, consts = _producers(g), _constants(g)
        for add, i in _mask_operands(g).values():
            add.input[i] = mask
            _scale_scores(e, producers, consts, add.input[1 - i])
        _drop_nan_guards(g)
        producers = _producers(g)
        scope = "/model/rotary_emb"
        for name, (table, lead) in _rotary_tables(model, base_dir, positions).items():
            producers[name].output[list(producers[name].output).index(name)] = f"{name}/run_time"  # now dead
            e.replacing = producers[name].name  # the table's Gather takes the place of the run-time node
            rows = e.op("Gather", [e.const(f"{name}/table", table), "position_ids"], scope,
                        [name] if lead == 1 else None, axis=0)
            if lead > 1:  # the export's tensor has more leading unit dims than position_ids: [B, 1, .., S, hd]
                e.op("Unsqueeze", [rows, e.const(f"lowered_axes_1_to_{lead - 1}", np.arange(1, lead, dtype=np.int64))],
                     scope, [name])
        g.node.extend(e.nodes)
        _topological(g)
        _prune(g)
        del g.value_info[:]
        e.stamp(model)
        return model

    @classmethod
    def fold_static(cls, model: Any) -> Any:
        """Shapes are fixed: shape arithmetic becomes constants (evaluated by onnxruntime), aliases are removed."""
        import onnx

        for _ in range(8):  # each round may fix shapes the next can fold (inference does not see through all ops)
            changed = _alias(model.graph) + _fold(model)
            if not changed:
                break
            del model.graph.value_info[:]
            model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        return model


def _opset(model: Any) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _producers(g: Any) -> dict[str, Any]:
    return {o: n for n in g.node for o in n.output}


def _sources(g: Any, through_shape: bool) -> dict[str, frozenset[str]]:
    """Tensor -> the graph inputs it is computed from (a Shape node's input counted only if `through_shape`)."""
    inputs = {i.name for i in g.input}
    out: dict[str, frozenset[str]] = {i: frozenset([i]) for i in inputs}
    for n in _ordered(g):
        ins = [] if n.op_type == "Shape" and not through_shape else [i for i in n.input if i]
        s = frozenset().union(*(out.get(i, frozenset()) for i in ins))
        for o in n.output:
            out[o] = s
    return out


def _ordered(g: Any) -> list[Any]:
    """The nodes in an order where each follows its inputs' producers (torch writes them so; a rewrite may not).
    By index: protobuf gives no stable object per element."""
    nodes = list(g.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    done: set[int] = set()
    order: list[int] = []
    for root in range(len(nodes)):
        stack = [(root, False)]
        while stack:
            k, expanded = stack.pop()
            if k in done:
                continue
            if expanded:
                done.add(k)
                order.append(k)
                continue
            stack.append((k, True))
            stack.extend((producer[i], False) for i in nodes[k].input if i in producer and producer[i] not in done)
    return [nodes[k] for k in order]


def _keep(g: Any, nodes: list[Any]) -> None:
    """Make `nodes` (elements of g.node, in this order) the graph's nodes."""
    from onnx import NodeProto

    copies = []
    for n in nodes:
        c = NodeProto()
        c.CopyFrom(n)
        copies.append(c)
    del g.node[:]
    g.node.extend(copies)


def _topological(g: Any) -> None:
    _keep(g, _ordered(g))


def _mask_operands(g: Any) -> dict[str, tuple[Any, int]]:
    """Softmax name -> (the Add before it, the index of its mask operand): the operand computed from
    attention_mask / position_ids alone (shapes aside), the other from the tokens or the cache."""
    producers = _producers(g)
    data = _sources(g, through_shape=False)
    out = {}
    for n in g.node:
        if n.op_type != "Softmax":
            continue
        add = producers.get(n.input[0])
        if add is None or add.op_type != "Add":
            raise NotADecoder(f"attention Softmax '{n.name}' does not read an Add of scores and mask")
        masks = [i for i, t in enumerate(add.input) if data.get(t, frozenset()) <= {"attention_mask", "position_ids"}]
        if len(masks) != 1:
            raise NotADecoder(f"attention Softmax '{n.name}': cannot tell its mask from its scores (one operand of "
                              f"'{add.name}' must be computed from attention_mask alone); export with optimum-cli's "
                              "text-generation-with-past task (SDPA attention), or report the exporter and version")
        out[n.name] = (add, masks[0])
    return out


def _constants(g: Any) -> dict[str, np.ndarray]:
    """The values of inline initializers and Constant nodes (`value` attributes)."""
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in g.initializer if not t.external_data}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _positions(g: Any) -> Any:
    """The Range computing the positions when the export takes no `position_ids` (transformers' cache_position,
    arange(past, past + seq), read by the rotary: optimum's Gemma): the one Range the Sin/Cos are computed from,
    starting at a past_key_values input's length, step 1."""
    producers, consts = _producers(g), _constants(g)
    seen, stack, ranges = set(), [i for n in g.node if n.op_type in ("Sin", "Cos") for i in n.input], []
    while stack:
        n = producers.get(stack.pop())
        if n is None or n.name in seen:
            continue
        seen.add(n.name)
        ranges += [n] if n.op_type == "Range" else []
        stack.extend(i for i in n.input if i)
    every = _sources(g, through_shape=True)
    found = [r for r in ranges if any(i.startswith("past_key_values.") for i in every.get(r.input[0], ()))
             and r.input[2] in consts and consts[r.input[2]].item() == 1]
    if len(found) != 1:
        raise NotADecoder(f"no position_ids input, and {len(found)} Range(s) from the past length feed the rotary "
                          "(expected one: the positions the graph computes); export with position_ids as an input "
                          "(optimum-cli exports them for most architectures), or report the exporter and version")
    return found[0]


def _take_positions(e: Emit, g: Any) -> None:
    """A `position_ids` input [batch, seq] replaces the positions the graph computes from the past length: a static
    graph's past length is fixed at CL - AR, its positions are not. The Range's readers read position_ids' row
    (batch 1 in static graphs), placed in the graph at once: the rotary tables are computed from it."""
    from onnx import TensorProto, helper

    r = _positions(g)
    name = r.output[0]
    r.output[0] = f"{name}/run_time"  # now dead
    g.node.append(helper.make_node("Gather", ["position_ids", e.const("lowered_zero", np.int64(0))], [name],
                                   name="/model/positions/Gather_lowered", axis=0))
    g.input.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]))


def _scale_scores(e: Emit, producers: dict[str, Any], consts: dict[str, np.ndarray], scores: str) -> None:
    """MatMul(Mul(q, c), Mul(kT, c')) (torch's SDPA scales both by the root of the scale) -> Mul(MatMul(q, kT),
    c c'), as the other conventions write it: the HTP simulator crashes on the quantized prompt graphs with the
    q-side Mul (onnxruntime-qnn 2.7.0, measured). Exact for powers of two (head_dim 16: 0.5 each), else to fp32
    rounding."""
    mm = producers.get(scores)
    if mm is None or mm.op_type != "MatMul":
        return
    sides = []
    for t in mm.input:
        mul = producers.get(t)
        c = [i for i in (mul.input if mul is not None and mul.op_type == "Mul" else []) if i in consts and consts[i].size == 1]
        if len(c) != 1:
            return
        sides.append(([i for i in mul.input if i != c[0]][0], consts[c[0]].astype(np.float32).reshape(())))
    (a, ca), (b, cb) = sides
    mm.input[:] = [a, b]
    mm.output[0] = scores + "/unscaled"
    scope = mm.name.rsplit("/", 1)[0]
    e.op("Mul", [mm.output[0], e.const(f"{scope}/scale", np.float32(ca * cb))], scope, [scores])


def _drop_nan_guards(g: Any) -> None:
    """Where(IsNaN(p), 0, p) after a Softmax p -> p."""
    producers = _producers(g)
    consts = _constants(g)
    for n in list(g.node):
        if n.op_type != "Where":
            continue
        cond = producers.get(n.input[0])
        p = n.input[2]
        if cond is None or cond.op_type != "IsNaN" or cond.input[0] != p or getattr(producers.get(p), "op_type", "") != "Softmax":
            continue
        if n.input[1] in consts and not consts[n.input[1]].any() and n.output[0] not in {o.name for o in g.output}:
            _rename(g, n.output[0], p)
            g.node.remove(n)


def _rotary_tables(model: Any, base_dir: str, positions: int) -> dict[str, tuple[np.ndarray, int]]:
    """The run-time rotary tensors (computed from position_ids alone, through Sin or Cos, read by nodes that are
    not) -> (their rows for positions 0 .. positions - 1 [positions, ...], the tensor's leading dims before the
    sequence axis), from the export's own subgraph run by onnxruntime."""
    import onnx

    g = model.graph
    every = _sources(g, through_shape=True)
    mine = [n for n in _ordered(g) if n.output and all(every.get(o, frozenset()) <= {"position_ids"} for o in n.output)]
    trig = set()
    for n in mine:  # what Sin/Cos feed; a Shape of it is shape arithmetic (Phi-3 slices q by cos's width), folded later
        if n.op_type in ("Sin", "Cos") or n.op_type != "Shape" and trig & set(n.input):
            trig.update(n.output)
    mine_out = {o for n in mine for o in n.output}
    readers = [n for n in g.node if not set(n.output) <= mine_out]
    wanted = sorted({i for n in readers for i in n.input if i in trig} | {o.name for o in g.output if o.name in trig})
    if not wanted:
        return {}
    producer = {o: k for k, n in enumerate(mine) for o in n.output}
    needed, stack = set(), list(wanted)
    while stack:  # the subgraph computing them
        k = producer.get(stack.pop())
        if k is not None and k not in needed:
            needed.add(k)
            stack.extend(i for i in mine[k].input if i)
    mine = [n for k, n in enumerate(mine) if k in needed]
    used = {i for n in mine for i in n.input}
    inits = [_inline(t, base_dir) for t in g.initializer if t.name in used]
    sub = onnx.helper.make_graph(mine, "rotary", [onnx.helper.make_tensor_value_info(
        "position_ids", onnx.TensorProto.INT64, [1, "positions"])], [onnx.helper.make_empty_tensor_value_info(w) for w in wanted], inits)
    full = _run(onnx.helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version),
                {"position_ids": np.arange(positions, dtype=np.int64)[None]})
    one = _run(onnx.helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version),
               {"position_ids": np.zeros((1, 1), np.int64)})
    out = {}
    for w, a, b in zip(wanted, full, one):
        axes = [k for k, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y] if a.ndim == b.ndim else []
        if len(axes) != 1 or axes[0] < 1 or any(d != 1 for d in a.shape[:axes[0]]):
            raise NotADecoder(f"rotary tensor '{w}' {list(a.shape)} is not [1, .., positions, ...]: ctxbuild cannot "
                              "make a table of it; report the exporter and its version")
        out[w] = (a.reshape(a.shape[axes[0]:]), axes[0])
    return out


def _inline(t: Any, base_dir: str) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(numpy_helper.to_array(t, base_dir), t.name) if t.external_data else t


def _run(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _rename(g: Any, old: str, new: str) -> None:
    for n in g.node:
        n.input[:] = [new if i == old else i for i in n.input]
        n.output[:] = [new if o == old else o for o in n.output]


def _prune(g: Any) -> None:
    """Drop nodes no graph output needs, and the initializers only they read."""
    nodes = list(g.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    needed, stack = set(), [o.name for o in g.output]
    while stack:
        k = producer.get(stack.pop())
        if k is not None and k not in needed:
            needed.add(k)
            stack.extend(i for i in nodes[k].input if i)
    _keep(g, [n for k, n in enumerate(nodes) if k in needed])
    _drop_unread(g)


def _drop_unread(g: Any) -> None:
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    inits = [t for t in g.initializer if t.name in read]
    del g.initializer[:]
    g.initializer.extend(inits)


def _types(g: Any) -> dict[str, Any]:
    return {v.name: v.type.tensor_type for v in (*g.input, *g.value_info, *g.output)}


def _alias(g: Any) -> int:
    """Nodes that pass their input through unchanged -> their readers read the input itself: Identity, Casts to
    the type the input has, Slices keeping the whole shape and Concats of one operand once their empty operands are
    dropped (Phi-3 splits q and k at the rotary width, q[..., :rotary] and an empty q[..., rotary:] when the rotary
    covers the head: QNN has no empty tensors). Where the output is a graph output, its producer writes it instead."""
    types = _types(g)
    types.update({t.name: t for t in g.initializer})
    consts = _constants(g)
    outputs = {o.name for o in g.output}
    held = outputs | {i.name for i in g.input} | {t.name for t in g.initializer}
    done = 0
    for n in list(g.node):
        if n.op_type == "Concat":
            kept = [i for i in n.input if 0 not in (_static_shape(types.get(i)) or [1])]
            if kept and len(kept) < len(n.input):
                n.input[:] = kept
                done += 1
        src, out = (n.input[0] if n.input else ""), n.output[0]
        if not src or not _passes_through(n, types, consts):
            continue
        if out not in outputs:
            _rename(g, out, src)
        elif src not in held:
            _rename(g, src, out)
        else:
            continue
        g.node.remove(n)
        done += 1
    return done


def _passes_through(n: Any, types: dict[str, Any], consts: dict[str, np.ndarray]) -> bool:
    src = n.input[0]
    if n.op_type == "Cast":
        return src in types and next(a.i for a in n.attribute if a.name == "to") == _elem(types[src])
    if n.op_type == "Slice":
        steps = n.input[4] if len(n.input) > 4 else ""
        shape = _static_shape(types.get(src))
        return shape is not None and shape == _static_shape(types.get(n.output[0])) and \
            (not steps or steps in consts and bool((consts[steps] == 1).all()))
    return n.op_type == "Identity" or n.op_type == "Concat" and len(n.input) == 1


def _elem(t: Any) -> int:
    return t.data_type if hasattr(t, "data_type") else t.elem_type


def _static_shape(t: Any) -> list[int] | None:
    """A value's fixed shape (t: its tensor type or an initializer), None if unknown or symbolic."""
    if t is not None and hasattr(t, "dims"):
        return list(t.dims)
    if t is None or not t.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    return None if any(d < 0 for d in dims) else dims


def _fold(model: Any) -> int:
    """Nodes computed from constants and fixed shapes alone -> initializers (onnxruntime evaluates them once)."""
    from onnx import helper, numpy_helper

    g = model.graph
    types = _types(g)
    known = {t.name for t in g.initializer if not t.external_data and np.prod(t.dims) <= FOLD_MAX}
    foldable: list[Any] = []
    for n in g.node:
        if n.op_type == "Shape":
            shape = _static_shape(types.get(n.input[0]))
            if shape is None:
                continue
            start = next((a.i for a in n.attribute if a.name == "start"), 0)
            end = next((a.i for a in n.attribute if a.name == "end"), None)
            const = helper.make_node("Constant", [], [n.output[0]], name=n.name,
                                     value=numpy_helper.from_array(np.array(shape[start:end], np.int64)))
            foldable.append(const)
        elif n.domain in ("", "ai.onnx") and not n.op_type.startswith("Random") and all(i in known for i in n.input if i):
            foldable.append(n)
        else:
            continue
        known.update(n.output)
    if not foldable:
        return 0
    names = {o for n in foldable for o in n.output}
    readers = {i for n in g.node if n.output[0] not in names for i in n.input}
    wanted = sorted((readers | {o.name for o in g.output}) & names)
    used = {i for n in foldable for i in n.input}
    sub = helper.make_graph(foldable, "fold", [], [helper.make_empty_tensor_value_info(w) for w in wanted],
                            [t for t in g.initializer if t.name in used])
    values = _run(helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version), {}) if wanted else []
    _keep(g, [n for n in g.node if not (n.output and n.output[0] in names)])
    g.initializer.extend(numpy_helper.from_array(np.asarray(v), w) for w, v in zip(wanted, values))
    _drop_unread(g)
    return len(foldable)
