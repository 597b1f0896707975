"""onnxruntime-genai's model-builder convention -> the canonical form, in plain ONNX ops the HTP runs.

Rewritten node by node (onnx's helper API; the graph stays topologically ordered, each replacement where its
node was):
- `GroupQueryAttention` (com.microsoft, packed QKV, do_rotary, non-interleaved) -> Split, heads, rotary from
  the op's own cos/sin caches gathered by a new `position_ids` input, `present = Concat(past, new)`, K/V heads
  repeated, scaled scores + the additive mask, Softmax, context;
- `SimplifiedLayerNormalization` stays (the HTP's RmsNorm, whole); `SkipSimplifiedLayerNormalization` -> Add +
  SimplifiedLayerNormalization (its output 3, the residual stream, is the Add; the Add is named in the scope of
  the layer writing `skip`, so the part cut sees one tensor between layers);
- the mask the optimum convention computes (from `attention_mask` and `position_ids`), once.
The seqlens_k / total_sequence_length ops the attention read become dead and are dropped by the extraction.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from ctxbuild.llm.canonical import NotADecoder
from ctxbuild.llm.exporters.base import Exporter
from ctxbuild.llm.exporters.emit import Emit

_LAYER = re.compile(r"^(/model/layers\.\d+)/")


class GenaiBuilder(Exporter):
    """com.microsoft GroupQueryAttention, the SimplifiedLayerNormalization family, no `position_ids`."""
    name = "onnxruntime-genai model builder"
    inputs = ("input_ids", "attention_mask")

    @classmethod
    def matches(cls, model: Any) -> bool:
        return any(n.op_type == "GroupQueryAttention" for n in model.graph.node)

    @classmethod
    def to_canonical(cls, model: Any, base_dir: str, positions: int) -> Any:
        return lower(model, base_dir)


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def lower(model: Any, base_dir: str = "") -> Any:
    """The optimum-convention equivalent of a model-builder decoder (modified in place and returned). `model` may be
    loaded without its external data (`base_dir`: where it lives): only the rotary caches are read."""
    from onnx import TensorProto, helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    for node in g.node:
        if node.op_type == "GroupQueryAttention":
            for name in list(node.input)[7:9]:
                if name in inits and uses_external_data(inits[name]):
                    load_external_data_for_tensor(inits[name], base_dir)
                    inits[name].data_location = 0  # now inline (onnx.TensorProto.DEFAULT)
                    del inits[name].external_data[:]
    past = next(i for i in g.input if i.name == "past_key_values.0.key")
    hd = past.type.tensor_type.shape.dim[3].dim_value
    e = Emit(g)
    mask = e.mask()
    head_nodes, rotary = list(e.nodes), {}
    producers = {o: n for n in g.node for o in n.output}
    new_nodes = head_nodes
    for node in g.node:
        e.nodes, e.replacing = [], node.name
        if node.op_type == "GroupQueryAttention":
            _attention(e, node, hd, mask, inits, rotary)
        elif node.op_type == "SkipSimplifiedLayerNormalization":
            src = producers.get(node.input[1])
            m = _LAYER.match(src.name) if src is not None else None
            add_scope = m.group(1) if m else node.name
            outs = list(node.output) + [""] * 4
            total_ = e.op("Add", list(node.input[:2]), add_scope, [outs[3]] if outs[3] else None)
            if len(node.input) > 3 and node.input[3]:
                total_ = e.op("Add", [total_, node.input[3]], add_scope)
            e.op("SimplifiedLayerNormalization", [total_, node.input[2]], node.name, [outs[0]] if outs[0] else None,
                 axis=-1, epsilon=_attr(node, "epsilon", 1e-5), stash_type=1)
        else:
            e.nodes = [node]
        new_nodes += e.nodes
    del g.node[:]
    g.node.extend(new_nodes)
    g.input.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]))
    del g.value_info[:]
    e.stamp(model)
    return model


def _attention(e: Emit, node: Any, hd: int, mask: str, inits: dict[str, Any], rotary: dict[str, tuple[str, str]]) -> None:
    from onnx import numpy_helper

    heads, kvh = _attr(node, "num_heads", 0), _attr(node, "kv_num_heads", 0)
    ins = list(node.input) + [""] * 12
    if ins[1] or ins[2] or _attr(node, "rotary_interleaved", 0) or _attr(node, "softcap", 0.0) or \
            _attr(node, "local_window_size", -1) != -1 or any(ins[9:]):
        raise NotADecoder(f"GroupQueryAttention '{node.name}': only packed QKV, non-interleaved rotary, no softcap, "
                          "no local window and no extra inputs are rewritten")
    scope = node.name.rsplit("/", 1)[0]
    scale = _attr(node, "scale", 0.0) or 1 / np.sqrt(hd)
    q, k, v = (scope + f"/lowered_{x}" for x in "qkv")
    e.op("Split", [ins[0], e.const(f"lowered_split_{heads}_{kvh}_{hd}", np.array([heads * hd, kvh * hd, kvh * hd], np.int64))],
         scope, [q, k, v], axis=-1)

    def split_heads(t: str, n: int) -> str:
        t = e.op("Reshape", [t, e.const(f"lowered_shape_00{n}{hd}", np.array([0, 0, n, hd], np.int64))], scope)
        return e.op("Transpose", [t], scope, perm=[0, 2, 1, 3])

    q, k, v = split_heads(q, heads), split_heads(k, kvh), split_heads(v, kvh)
    if _attr(node, "do_rotary", 0):
        if (ins[7], ins[8]) not in rotary:  # the caches hold head_dim / 2 columns: repeat them (rotate-half form)
            cos, sin = (numpy_helper.to_array(inits[n]) for n in (ins[7], ins[8]))
            full = [e.const(f"{n}/lowered_full", np.concatenate([c, c], axis=-1).astype(np.float32))
                    for n, c in ((ins[7], cos), (ins[8], sin))]
            axis1 = e.const("lowered_axes_1", np.array([1], np.int64))
            rotary[(ins[7], ins[8])] = tuple(  # type: ignore[assignment]
                e.op("Unsqueeze", [e.op("Gather", [t, "position_ids"], "/model/rotary_emb"), axis1], "/model/rotary_emb")
                for t in full)
        cos_, sin_ = rotary[(ins[7], ins[8])]
        half = e.const(f"lowered_rope_split_{hd}", np.array([hd // 2, hd // 2], np.int64))

        def rope(t: str) -> str:
            lo, hi = t + "/lo", t + "/hi"
            e.op("Split", [t, half], scope, [lo, hi], axis=-1)
            rotated = e.op("Concat", [e.op("Neg", [hi], scope), lo], scope, axis=-1)
            return e.op("Add", [e.op("Mul", [t, cos_], scope), e.op("Mul", [rotated, sin_], scope)], scope)

        q, k = rope(q), rope(k)
    present_k = e.op("Concat", [ins[3], k], scope, [node.output[1]], axis=2)
    present_v = e.op("Concat", [ins[4], v], scope, [node.output[2]], axis=2)

    def repeat(t: str) -> str:
        if heads == kvh:
            return t
        u = e.op("Unsqueeze", [t, e.const("lowered_axes_2", np.array([2], np.int64))], scope)
        rep = e.op("Concat", [u] * (heads // kvh), scope, axis=2)
        return e.op("Reshape", [rep, e.const(f"lowered_shape_0{heads}m1{hd}", np.array([0, heads, -1, hd], np.int64))], scope)

    scores = e.op("Mul", [e.op("MatMul", [q, e.op("Transpose", [repeat(present_k)], scope, perm=[0, 1, 3, 2])], scope),
                          e.const(f"{scope}/lowered_scale", np.float32(scale))], scope)
    probs = e.op("Softmax", [e.op("Add", [scores, mask], scope)], scope, axis=-1)
    ctx = e.op("Transpose", [e.op("MatMul", [probs, repeat(present_v)], scope)], scope, perm=[0, 2, 1, 3])
    e.op("Reshape", [ctx, e.const(f"lowered_shape_00{heads * hd}", np.array([0, 0, heads * hd], np.int64))], scope,
         [node.output[0]])
