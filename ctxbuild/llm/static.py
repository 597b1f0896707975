"""Static graphs of a dynamic decoder: one ONNX graph per (part, AR, CL) with explicit KV-cache I/O.

What changes (onnx's own graph API and Extractor, no string surgery on protobuf text):
- shapes are fixed: batch 1, AR new tokens, CL - AR past positions;
- the mask the model computes from its 2-D `attention_mask` (the tensor every attention's Softmax input
  adds) becomes the input `attention_mask` [1, 1, AR, CL] (additive, MASK_NEG where masked), so the
  runtime decides which cache slots are valid; the Range/Shape ops that built it are gone;
- each `present.N.key/value` is the AR new positions only (the second operand of the model's
  Concat(past, new)), not past + new: the runtime writes them into its cache;
- the model is cut into parts by layer ranges (exporter scopes `/model/layers.N/`); part p > 0 reads the
  residual stream `hidden_states.K` part p - 1 writes (K = its first layer);
- a Transpose of a weight (a tied LM head) is folded into the weight.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ctxbuild.llm import exporters, norms
from ctxbuild.llm.canonical import LAYER, DecoderShape, NotADecoder
from ctxbuild.llm.convention import check_decoder, load_decoder



@dataclass(frozen=True)
class GraphSpec:
    name: str  # AI Hub's convention: prompt_ar128_cl4096_1_of_3, token_ar1_cl4096_1_of_3
    part: int  # 0-based
    ar: int
    cl: int


def graph_name(part: int, parts: int, ar: int, cl: int) -> str:
    return f"{'token' if ar == 1 else 'prompt'}_ar{ar}_cl{cl}_{part + 1}_of_{parts}"


def weights_name(part: int, parts: int) -> str:
    """The external data file every graph of a part points into (its AR x CL graphs differ in shapes only)."""
    return f"weights_{part + 1}_of_{parts}.data"


def weights_role(part: int) -> str:
    """That file's role among the outputs of llm_split (float) and of the part's llm_quantize (QDQ)."""
    return f"weights:part{part + 1}"


def records_name(part: int, parts: int) -> str:
    """The part's recorded calls (ctxbuild/llm/records.py), an output of llm_split."""
    return f"records_{part + 1}_of_{parts}.npz"


def records_role(part: int) -> str:
    return f"records:part{part + 1}"


def part_ranges(layers: int, parts: int) -> list[tuple[int, int]]:
    """Layer ranges [start, stop) of nearly equal size, earlier parts one layer larger."""
    base, extra = divmod(layers, parts)
    out, start = [], 0
    for p in range(parts):
        stop = start + base + (1 if p < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def specs(parts: int, ars: list[int], cls: list[int]) -> list[GraphSpec]:
    return [GraphSpec(graph_name(p, parts, ar, cl), p, ar, cl) for p in range(parts) for cl in cls for ar in ars]


def static_graph(model: Any, shape: DecoderShape, ranges: list[tuple[int, int]], part: int, ar: int, cl: int,
                 base_dir: str = "", slots: tuple[str, ...] = (), fold: Callable[[Any], Any] | None = None) -> Any:
    """The static graph of one part at (AR, CL); `model` is left unchanged. `model` may be loaded without its
    external data (`base_dir`: where it lives): the graph work needs shapes only, so a decoder of any size is
    rewritten without its weights in memory; they are copied when the graph is saved. `slots`: LoRA slot inputs of
    `model`; the part keeps those its nodes read as inputs. `fold`: the exporter's rewrite of the whole model with
    these shapes fixed, before the part is cut (exporters/base.py, fold_static)."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    mask = _mask_tensor(g)
    producers = {o: n for n in g.node for o in n.output}
    g.node.remove(producers[mask])
    _rename(g, mask, "attention_mask")
    for i in range(shape.layers):
        for kv in ("key", "value"):
            _new_positions_only(g, i, kv, producers)
    start, stop = ranges[part]
    boundaries = {k: _boundary(g, k) for r in ranges for k in (r[0],) if k > 0}
    for k, t in boundaries.items():
        _rename(g, t, f"hidden_states.{k}")

    past = cl - ar
    fixed = {"input_ids": [1, ar], "position_ids": [1, ar]}
    for i in range(shape.layers):
        for kv in ("key", "value"):
            fixed[f"past_key_values.{i}.{kv}"] = [1, shape.kv_heads, past, shape.head_dim]
    new_inputs = []
    for v in g.input:
        if v.name == "attention_mask":
            continue
        for d, n in zip(v.type.tensor_type.shape.dim, fixed.get(v.name, [])):
            d.Clear()
            d.dim_value = n
        new_inputs.append(v)
    new_inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, [1, 1, ar, cl]))
    del g.input[:]
    g.input.extend(new_inputs)
    del g.output[:]
    g.output.extend([helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, ar, shape.vocab])] + [
        helper.make_tensor_value_info(f"present.{i}.{kv}", TensorProto.FLOAT, [1, shape.kv_heads, ar, shape.head_dim])
        for i in range(shape.layers) for kv in ("key", "value")])
    del g.value_info[:]
    m = norms.through_norms(m, lambda x: onnx.shape_inference.infer_shapes(x, data_prop=True))
    if fold is not None:
        m = fold(m)
    fused = norms.fuse_rmsnorms(m)

    ins = (["input_ids"] if part == 0 else [f"hidden_states.{start}"]) + ["attention_mask", "position_ids"]
    ins += [f"past_key_values.{i}.{kv}" for i in range(start, stop) for kv in ("key", "value")]
    outs = ["logits"] if part == len(ranges) - 1 else [f"hidden_states.{stop}"]
    outs += [f"present.{i}.{kv}" for i in range(start, stop) for kv in ("key", "value")]
    used = {i for n in m.graph.node for i in n.input}
    ins = [i for i in ins if i in used or i.startswith("hidden_states.")]  # a part may not need position_ids
    sub = onnx.utils.Extractor(m).extract_model(ins + list(slots), outs)
    read = {i for n in sub.graph.node for i in n.input}
    kept = [v for v in sub.graph.input if v.name not in slots or v.name in read]
    del sub.graph.input[:]
    sub.graph.input.extend(kept)
    _fold_weight_transposes(sub.graph, base_dir)  # after the cut: only the part holding the LM head reads it
    sub.graph.name = graph_name(part, len(ranges), ar, cl)
    sub.ir_version = model.ir_version
    del sub.opset_import[:]
    sub.opset_import.extend(model.opset_import)
    _stamp_names(sub, model, {f"hidden_states.{k}": t for k, t in boundaries.items()}, fused)
    return sub


def _stamp_names(sub: Any, model: Any, renamed: dict[str, str], fused: dict[str, str]) -> None:
    """The export's names for what this graph renamed, as prepare records them (graph/nodenames.py): the nodes the
    exporter plug-in emitted (their record in `model`: llm/exporters/emit.py) and the residual stream at a cut
    (`renamed`: new tensor name -> the export's), the fused RMSNorms (`fused`: each one's ReduceMean), for the
    graph's own nodes and tensors; a compile's refusal and a part check's failure name them so."""
    import json

    from onnx import helper

    from ctxbuild.graph.nodenames import KEY

    emitted = json.loads({p.key: p.value for p in model.metadata_props}.get(KEY, "{}")).get("from", {})
    mine = {n.name for n in sub.graph.node}
    tensors = {t for n in sub.graph.node for t in (*n.input, *n.output)}
    emitted.update({n: emitted.get(mean, [mean]) for n, mean in fused.items()})
    record = {"from": {n: u for n, u in emitted.items() if n in mine},
              "tensor_from": {t: u for t, u in renamed.items() if t in tensors}}
    if record := {k: v for k, v in record.items() if v}:
        helper.set_model_props(sub, {KEY: json.dumps(record, sort_keys=True)})


def _fold_weight_transposes(g: Any, base_dir: str) -> None:
    from onnx import numpy_helper

    inits = {t.name: t for t in g.initializer}
    for n in list(g.node):
        if n.op_type == "Transpose" and n.input[0] in inits:
            perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
            arr = numpy_helper.to_array(inits[n.input[0]], base_dir).transpose(perm)
            g.initializer.append(numpy_helper.from_array(arr.copy(), n.output[0]))
            g.node.remove(n)
            if not any(n.input[0] in m.input for m in g.node):  # the last part of a tied model: the head alone
                g.initializer.remove(inits[n.input[0]])


def _mask_tensor(g: Any) -> str:
    """The additive mask: the operand every Softmax's input Add shares."""
    producers = {o: n for n in g.node for o in n.output}
    operands = []
    for n in g.node:
        if n.op_type == "Softmax":
            add = producers.get(n.input[0])
            if add is None or add.op_type != "Add":
                raise NotADecoder(f"attention Softmax '{n.name}' does not read an Add of scores and mask")
            operands.append(set(add.input))
    common = set.intersection(*operands) if operands else set()
    if len(common) != 1:
        raise NotADecoder("cannot find the attention mask: no single tensor is added before every Softmax")
    return common.pop()


def _new_positions_only(g: Any, layer: int, kv: str, producers: dict[str, Any]) -> None:
    """present.N = Concat(past.N, new): the graph outputs `new` under the present name instead."""
    name = f"present.{layer}.{kv}"
    concat = producers.get(name)
    past = f"past_key_values.{layer}.{kv}"
    if concat is None or concat.op_type != "Concat" or list(concat.input)[:1] != [past] or len(concat.input) != 2:
        raise NotADecoder(f"{name} is not Concat({past}, new positions)")
    new = concat.input[1]
    _rename(g, name, f"{name}/full")
    _rename(g, new, name)


def _boundary(g: Any, k: int) -> str:
    """The residual stream entering layer k: what layer k's nodes read from layer k - 1's."""
    scope = {o: int(m.group(1)) for n in g.node if (m := LAYER.search(n.name)) for o in n.output}
    found = {i for n in g.node if (m := LAYER.search(n.name)) and int(m.group(1)) == k
             for i in n.input if scope.get(i) == k - 1}
    if len(found) != 1:
        raise NotADecoder(f"cannot cut before layer {k}: its nodes read {len(found)} tensors of layer {k - 1} "
                          "(expected the residual stream alone; node names need /model/layers.N/ scopes)")
    return found.pop()


def _rename(g: Any, old: str, new: str) -> None:
    for n in g.node:
        n.input[:] = [new if i == old else i for i in n.input]
        n.output[:] = [new if o == old else o for o in n.output]
    for v in (*g.input, *g.output, *g.value_info):
        if v.name == old:
            v.name = new


def write_static_graphs(src: Path, parts: int, ars: list[int], cls: list[int], dst: dict[str, Path],
                        weights: list[Path], adapter_slots: dict[str, Any] | None = None,
                        alpha: tuple[dict[str, Any], dict[str, Path]] | None = None) -> DecoderShape:
    """Every (part, AR, CL) graph of `src` to `dst[graph name]`, all of part p's weights in one file `weights[p]`
    beside them (each tensor once, however many graphs read it). The model is read without its external data and
    the weights are streamed from `src`'s files as they are saved: memory stays at the graph structure (plus inline
    weights) whatever the model's size, and no protobuf nears its 2 GB limit.
    `adapter_slots` ({patterns, scaling}): those weights become graph inputs, each with its default (the base's
    value) as an initializer of the same name, so the graph runs without an adapter and an adapter overrides them.
    `alpha` (switch: alpha spec, adapter name -> file): the adapters attached to the canonical decoder as branches
    gated by the lora_alpha input (lora/alpha.py), which `adapter_slots` then names."""
    from ctxbuild.graph.modelio import SharedData
    from ctxbuild.lora.adapters import add_defaults, make_slots

    model = load_decoder(src)
    shape = check_decoder(model)
    convention = exporters.detect(model)
    model = convention.to_canonical(model, str(src.parent), max(cls))
    if parts > shape.layers:
        raise NotADecoder(f"{parts} parts for a model of {shape.layers} layers: at most one part per layer")
    ranges = part_ranges(shape.layers, parts)
    alpha_map = None
    if alpha:
        from ctxbuild.lora.alpha import attach, stamp

        alpha_map = attach(model, *alpha)
    defaults: dict[str, Any] = {}
    if adapter_slots:
        scaling = adapter_slots["scaling"]
        _load_data(model, adapter_slots["patterns"] + ([scaling] if scaling else []), src.parent)
        defaults = make_slots(model, adapter_slots["patterns"], scaling)
    graphs = specs(parts, ars, cls)
    for part in range(parts):
        with SharedData(weights[part]) as data:
            for s in [g for g in graphs if g.part == part]:
                sub = static_graph(model, shape, ranges, s.part, s.ar, s.cl, str(src.parent), tuple(defaults),
                                   convention.fold_static)
                mine = {i.name for i in sub.graph.input}
                add_defaults(sub, {k: v for k, v in defaults.items() if k in mine})
                if alpha_map and alpha_map["input"] in mine:  # the wrappers carry it (lora/wrappers.py)
                    stamp(sub, alpha_map)
                # small tensors (shape constants) stay inline: shape inference needs their values
                data.save(sub, src.parent, dst[s.name], inline_max=1023)
    return shape


def _load_data(model: Any, patterns: list[str], base_dir: Path) -> None:
    """Read the values of the initializers matching `patterns` from the external data (the model was loaded
    without it): they become the slots' defaults, inline in each graph (saving moves the large ones out again)."""
    import fnmatch

    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    for t in model.graph.initializer:
        if uses_external_data(t) and any(fnmatch.fnmatchcase(t.name, p) for p in patterns):
            load_external_data_for_tensor(t, str(base_dir))
            t.data_location = TensorProto.DEFAULT
            del t.external_data[:]
