"""Whether an ONNX model is a decoder ctxbuild can cut into static graphs, read from its graph alone (no
weights), with clear refusals; its shape and where its weights sit. Which exporter wrote it is the exporters
registry's business (llm/exporters/); other contrib attention ops are refused.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError
from ctxbuild.graph.external_data import load_data
from ctxbuild.graph.signature import memoized_by_stat
from ctxbuild.llm import export_config, exporters
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
    convention = exporters.detect(model)
    needed = convention.inputs
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
    if len(dims) != 4 or not logits:
        raise NotADecoder("past_key_values.0.key must be [batch, kv_heads, past, head_dim] and logits [.., vocab]")
    open_dims = [f"{what} ('{d.dim_param}')" for what, d in (("kv_heads", dims[1]), ("head_dim", dims[3]),
                                                            ("the vocabulary", logits[-1])) if not d.dim_value]
    if open_dims:
        raise NotADecoder(f"{', '.join(open_dims)} of the KV cache / logits is symbolic and no exporter config beside "
                          "the model gives it: keep the exporter's genai_config.json or config.json beside the model")
    convention.check(model)
    hidden = _embedding_width(model)
    if hidden is None:
        raise NotADecoder("no embedding: expected a Gather by input_ids of a [vocab, hidden] weight (or of its "
                          "Transpose, a tied LM head)")
    return DecoderShape(len(layers), dims[1].dim_value, dims[3].dim_value, logits[-1].dim_value, hidden)


def _embedding_width(model: Any) -> int | None:
    """The hidden width of the table input_ids gathers: a [vocab, hidden] weight, or Transpose([hidden, vocab]),
    as the model builder writes a tied embedding (`Gather(Transpose(lm_head.MatMul.weight))`)."""
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        if n.op_type != "Gather" or n.input[1] != "input_ids":
            continue
        if n.input[0] in inits and len(inits[n.input[0]].dims) == 2:
            return int(inits[n.input[0]].dims[1])
        t = producers.get(n.input[0])
        if t is not None and t.op_type == "Transpose" and t.input[0] in inits and len(inits[t.input[0]].dims) == 2:
            return int(inits[t.input[0]].dims[0])
    return None


def load_decoder(path: Path) -> Any:
    """The decoder's graph without its weights' external data, the dims its graph leaves symbolic taken from the
    exporter's config beside it (llm/export_config.py). Constant nodes' values are read in: torch.onnx saving a
    model over 2 GB moves them to the data file too (optimum's Qwen2.5-Coder-0.5B export: the rotary inv_freq
    [1, 32, 1]), and the exporters' rewrites read constants' values."""
    import onnx

    model = onnx.load(os.fspath(path), load_external_data=False)
    load_data(model, path, follow_links=True, initializers=False)
    export_config.fix_symbolic_dims(model, export_config.read(path))
    return model


MEMO = "memo/llm-decoder-9"  # bump when what check_decoder accepts changes: old verdicts are then not read


def decoder_facts(model: Path) -> dict[str, Any] | None:
    """check_decoder at plan time, memoized in the user cache by the file's stat (a re-plan does not parse the
    model again): {"layers": N, "weights": initializer names, "weight_sizes": [[name, elements, where]] (where: the
    layer, FIRST for the embedding, LAST for what follows the layers), "inputs": graph input names, "readers":
    {initializer or input: the wheres of the nodes reading it} (where an adapter slot lands)} or {"error": why};
    None if the file does not parse as ONNX (llm_split reports it)."""
    # the exporter's configs beside it are part of the verdict (they fix symbolic dims): their stats key the memo
    configs = [[n, p.stat().st_size, p.stat().st_mtime_ns] for n, p in export_config.files(model).items()]
    key = hashlib.sha256(json.dumps(configs).encode()).hexdigest()[:16]
    return memoized_by_stat(model, f"{MEMO}/{key}", lambda: _facts(model))


def _facts(model: Path) -> dict[str, Any] | None:
    from google.protobuf.message import DecodeError

    try:
        m = load_decoder(model)
    except export_config.BadExportConfig as e:
        return {"error": str(e)}
    except (DecodeError, ValueError, RuntimeError, OSError, ActionError):  # a missing .data file too: llm_split says so
        return None
    try:
        shape = check_decoder(m)
        cfg = export_config.read(model)  # its special ids inside the graph's own vocabulary too (logits)
        export_config.check_special(cfg.special, shape.vocab, {k: model.parent / cfg.source[k] for k in cfg.special})
        return {"layers": shape.layers, "weights": [t.name for t in m.graph.initializer], "vocab": shape.vocab,
                "weight_sizes": weight_sizes(m), "inputs": [i.name for i in m.graph.input], "readers": readers(m),
                "matmul_rows": matmul_rows(m)}
    except (NotADecoder, export_config.BadExportConfig) as e:
        return {"error": str(e)}


def _where(node: Any, embedding: set[str]) -> int:
    """`embedding`: the outputs the input_ids Gather reads (a tied table's Transpose is the embedding's too)."""
    m = LAYER.search(node.name)
    return int(m.group(1)) if m else FIRST if "input_ids" in node.input or embedding & set(node.output) else LAST


def _gathered(model: Any) -> set[str]:
    return {n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[1] == "input_ids"}


def matmul_rows(model: Any) -> dict[str, int]:
    """2-D initializer a MatMul reads as its second input -> its rows (the int4 blocks' axis)."""
    inits = {t.name: t for t in model.graph.initializer if len(t.dims) == 2}
    return {n.input[1]: int(inits[n.input[1]].dims[0]) for n in model.graph.node
            if n.op_type == "MatMul" and n.input[1] in inits}


def readers(model: Any) -> dict[str, list[int]]:
    """Initializer or graph input -> the wheres (layer, FIRST, LAST; see weight_sizes) of the nodes reading it."""
    names = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    out: dict[str, set[int]] = {}
    embedding = _gathered(model)
    for n in model.graph.node:
        for i in n.input:
            if i in names:
                out.setdefault(i, set()).add(_where(n, embedding))
    return {k: sorted(v) for k, v in sorted(out.items())}


def weight_sizes(model: Any) -> list[tuple[str, int, int]]:
    """(initializer, elements, where) for every float matrix a node reads: where is the node's layer (its
    `/model/layers.N/` scope), FIRST for the embedding Gather, LAST for other nodes outside the layers (LM head,
    rotary tables). A tied embedding appears twice: the first and the last part each hold a copy."""
    from onnx import TensorProto

    inits = {t.name: t for t in model.graph.initializer
             if len(t.dims) >= 2 and t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)}
    out = set()
    embedding = _gathered(model)
    for n in model.graph.node:
        out.update((i, math.prod(inits[i].dims), _where(n, embedding)) for i in n.input if i in inits)
    return sorted(out)
