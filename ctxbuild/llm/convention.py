"""Whether an ONNX model is a decoder ctxbuild can cut into static graphs, read from its graph alone (no
weights), with clear refusals; its shape and where its weights sit. Which exporter wrote it is the exporters
registry's business (llm/exporters/); other contrib attention ops are refused.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ctxbuild.graph.signature import memoized_by_stat
from ctxbuild.llm import exporters
from ctxbuild.llm.canonical import FIRST, LAST, LAYER, PAST, DecoderShape, NotADecoder

REFUSED_OPS = {"RotaryEmbedding", "MultiHeadAttention", "Attention", "PackedAttention", "SparseAttention",
               "PagedAttention", "MatMulNBits", "SkipLayerNormalization"}
def check_decoder(model: Any) -> DecoderShape:
    """The decoder's shape from its graph I/O; raises NotADecoder naming what is wrong."""
    ops = sorted({n.op_type for n in model.graph.node if n.op_type in REFUSED_OPS})
    if ops:
        raise NotADecoder(f"the model uses {', '.join(ops)}, which ctxbuild cannot rewrite for the HTP; export it "
                          "with optimum (plain ONNX ops) or onnxruntime-genai's builder (GroupQueryAttention) in fp32")
    inputs = {i.name: i for i in model.graph.input}
    outputs = {o.name: o for o in model.graph.output}
    needed = exporters.detect(model).inputs
    missing = [n for n in needed if n not in inputs]
    missing += [n for n in ("logits",) if n not in outputs]
    if missing:
        raise NotADecoder(f"not a decoder in the optimum or onnxruntime-genai convention: no {', '.join(missing)} "
                          f"(inputs: {', '.join(list(inputs)[:6])}...)")
    layers = sorted({int(m.group(1)) for n in inputs if (m := PAST.match(n))})
    if not layers or layers != list(range(len(layers))):
        raise NotADecoder("not a decoder with an explicit KV cache: expected inputs past_key_values.N.key/value "
                          "for N = 0, 1, ... (export with use_cache / with-past)")
    for i in layers:
        for kv in ("key", "value"):
            if f"past_key_values.{i}.{kv}" not in inputs or f"present.{i}.{kv}" not in outputs:
                raise NotADecoder(f"layer {i}: past_key_values.{i}.{kv} or present.{i}.{kv} is missing")
    dims = [d for d in inputs["past_key_values.0.key"].type.tensor_type.shape.dim]
    logits = [d for d in outputs["logits"].type.tensor_type.shape.dim]
    if len(dims) != 4 or not dims[1].dim_value or not dims[3].dim_value or not logits or not logits[-1].dim_value:
        raise NotADecoder("past_key_values.0.key must be [batch, kv_heads, past, head_dim] with kv_heads and "
                          "head_dim fixed, and logits' last dim (vocabulary) fixed")
    inits = {t.name: t for t in model.graph.initializer}
    embed = next((inits[n.input[0]] for n in model.graph.node
                  if n.op_type == "Gather" and n.input[1] == "input_ids" and n.input[0] in inits), None)
    if embed is None or len(embed.dims) != 2:
        raise NotADecoder("no embedding: expected a Gather of a [vocab, hidden] weight by input_ids")
    return DecoderShape(len(layers), dims[1].dim_value, dims[3].dim_value, logits[-1].dim_value, embed.dims[1])


MEMO = "memo/llm-decoder-4"  # bump when what check_decoder accepts changes: old verdicts are then not read


def decoder_facts(model: Path) -> dict[str, Any] | None:
    """check_decoder at plan time, memoized in the user cache by the file's stat (a re-plan does not parse the
    model again): {"layers": N, "weights": initializer names, "weight_sizes": [[name, elements, where]] (where: the
    layer, FIRST for the embedding, LAST for what follows the layers), "inputs": graph input names, "readers":
    {initializer or input: the wheres of the nodes reading it} (where an adapter slot lands)} or {"error": why};
    None if the file does not parse as ONNX (llm_split reports it)."""
    return memoized_by_stat(model, MEMO, lambda: _facts(model))


def _facts(model: Path) -> dict[str, Any] | None:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        m = onnx.load(os.fspath(model), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError):
        return None
    try:
        return {"layers": check_decoder(m).layers, "weights": [t.name for t in m.graph.initializer],
                "weight_sizes": weight_sizes(m), "inputs": [i.name for i in m.graph.input], "readers": readers(m)}
    except NotADecoder as e:
        return {"error": str(e)}


def _where(node: Any) -> int:
    m = LAYER.search(node.name)
    return int(m.group(1)) if m else FIRST if "input_ids" in node.input else LAST


def readers(model: Any) -> dict[str, list[int]]:
    """Initializer or graph input -> the wheres (layer, FIRST, LAST; see weight_sizes) of the nodes reading it."""
    names = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    out: dict[str, set[int]] = {}
    for n in model.graph.node:
        for i in n.input:
            if i in names:
                out.setdefault(i, set()).add(_where(n))
    return {k: sorted(v) for k, v in sorted(out.items())}


def weight_sizes(model: Any) -> list[tuple[str, int, int]]:
    """(initializer, elements, where) for every float matrix a node reads: where is the node's layer (its
    `/model/layers.N/` scope), FIRST for the embedding Gather, LAST for other nodes outside the layers (LM head,
    rotary tables). A tied embedding appears twice: the first and the last part each hold a copy."""
    from onnx import TensorProto

    inits = {t.name: t for t in model.graph.initializer
             if len(t.dims) >= 2 and t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)}
    out = set()
    for n in model.graph.node:
        out.update((i, math.prod(inits[i].dims), _where(n)) for i in n.input if i in inits)
    return sorted(out)
