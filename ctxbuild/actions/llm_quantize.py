"""llm_quantize: one part's static graphs to QDQ with onnxruntime's QNN quantization config.

Calibration data is what the part really sees: the float static graphs are chained over the recipe's prompts
(prompt chunks, then greedy token steps, at every CL) and each call's inputs to this part's graphs are recorded.
Weights are symmetric (int4 for w4a16, int8 for w8a16; onnxruntime's QNN config gives MatMul weights one scale per
matrix, which llm.quantization's settings, per channel and block-wise by default, rewrite: ctxbuild/llm/int4_graph.py;
precision auto chooses among such settings per part: ctxbuild/llm/auto_precision.py), so every AR x CL graph of the
part gets the same quantized weights and encodings: the bundle stores them once, and so does the part's one QDQ
weight file (each graph is quantized alone, then all of them are saved into it, a tensor's bytes once). The KV-cache
I/O takes the recipe's type.

LoRA (llm.adapters): the float graphs carry each slot's default as an initializer; the quantizer gets them as plain
inputs (activations, like the other recipes' slots), calibrated over the decode with no adapter and with each
adapter of the `calibrate` set bound (MAX_SAMPLES calls of each).
"""
from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.errors import ActionError
from ctxbuild.recipes import precisions
from ctxbuild.graph.external_data import PrivateData
from ctxbuild.graph.modelio import SharedData, data_path, load
from ctxbuild.llm.ar_sessions import one_ar_runner
from ctxbuild.llm.int4_graph import Weights4, choose, gather, matmul_weights, ranked_8bit, rewrite
from ctxbuild.llm.layout import Layout
from ctxbuild.llm.norms import QDQ_OPSET, at_opset_21
from ctxbuild.llm.pipeline import Bound
from ctxbuild.llm.prompts import load_prompts, prompt_files, tokenizer_of
from ctxbuild.llm.records import Call
from ctxbuild.llm.static import weights_role
from ctxbuild.plan.action import Action

MAX_SAMPLES = 16  # calibration samples per graph (prompt chunks and token steps)


def discover_inputs(action: Action) -> dict[str, Path]:
    return prompt_files(Path(action.watch[0]), action.params["samples"])


def calibration_feeds(layout: Layout, models: dict[tuple[int, int, int], Path], prompts: list[np.ndarray],
                      tokens: int, part: int, bound: Bound | None = None) -> dict[tuple[int, int, int], list[Call]]:
    """The first MAX_SAMPLES calls' inputs to each of `part`'s graphs (with its slots' values from `bound`) while the
    float pipeline decodes `prompts` at each CL. One CL's sessions of one AR at a time, and only what is kept is
    recorded, compactly (records.Call: the past KV up to its valid positions; the quantizer reads them expanded):
    an LLM's KV-cache inputs are large (at CL 2048 ~8 MB per layer and call, of which a short prompt fills a few
    percent), and they stay through every graph's quantization."""
    from ctxbuild.llm import pipeline

    bound = bound or {}
    feeds: dict[tuple[int, int, int], list[Call]] = {}
    ars = sorted({g.ar for g in layout.graphs})
    for cl in sorted({g.cl for g in layout.graphs}):
        run_cpu = one_ar_runner({k: v for k, v in models.items() if k[2] == cl}, bound)

        def record(part_: int, ar: int, cl_: int, f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            kept = feeds.setdefault((part_, ar, cl_), []) if part_ == part else []
            if len(kept) < MAX_SAMPLES:
                kept.append(Call.of(part_, ar, cl_, {**f, **bound.get((part_, ar, cl_), {})}))
            return run_cpu(part_, ar, cl_, f)

        for prompt in prompts:
            pipeline.generate(record, layout.parts, (layout.kv_heads, layout.head_dim), prompt, tokens, cl, ars[-1])
    return feeds  # (the next CL's runner replaces this one's: its sessions close before new ones open)


def run(ctx: Any) -> None:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    a, p = ctx.action, ctx.action.params
    layout = Layout.read(Path(a.inputs["layout"]))
    floats = layout.models("model", a.inputs)
    prompts = load_prompts(discover_inputs(a), p["samples"], tokenizer_of(a))
    defaults, variants = adapter_variants(a.inputs, floats, p.get("adapters") or {})
    feeds: dict[tuple[int, int, int], list[Call]] = {}
    try:
        for bound in variants:  # each variant's MAX_SAMPLES calls per graph: the encodings cover all of them
            for key, calls in calibration_feeds(layout, floats, prompts, p["tokens"], p["part"], bound).items():
                feeds.setdefault(key, []).extend(calls)
    except ValueError as e:  # a prompt too long for a CL
        raise ActionError(f"{a.recipe_files[0]}: calibration: {e}",
                          "use shorter prompts, fewer llm.generate tokens or larger context_lengths") from None
    kv = getattr(QuantType, {"uint16": "QUInt16", "uint8": "QUInt8"}[p["kv_cache"]])
    mine = [g for g in layout.graphs if g.name in p["graphs"]]
    print(f"calibration: {len(prompts)} prompts, per graph " + ", ".join(
        f"{g.name} {len(feeds.get((g.part, g.ar, g.cl), []))} calls / "
        f"{sum(c.valid for c in feeds.get((g.part, g.ar, g.cl), []))} tokens" for g in mine))
    cache = past_ranges(feeds)
    w4, ranked = _int4_weights(p, floats, feeds, mine)
    if w4 is not None:  # in the build record: the ranking, how many rows chose them
        ctx.facts["weights"] = w4.summary()
    # onnxruntime's quantizer reads its input through onnx's loader: copies of the part's weight file where the
    # cache shares it by hard link, made once for all the part's graphs
    with PrivateData() as data:
        for g in mine:
            model = floats[(g.part, g.ar, g.cl)]
            samples = feeds.get((g.part, g.ar, g.cl), [])
            # a private copy beside the model: onnxruntime writes scratch files beside its input
            src = model.with_name(f".llm-quantize-{os.getpid()}-{model.name}")
            opset = _private_copy(model, src, set(defaults[(g.part, g.ar, g.cl)]), data)
            try:
                names, sensitive, weights = _io_and_sensitive(src)
                overrides = {n: [{"quant_type": kv, **cache.get(n, {})}] for n in names
                             if n.startswith(("past_key_values.", "present."))}
                if p["precision"] == "w4a16":  # embedding, LM head, the recipe's keep_8bit and the ranked stay 8-bit
                    kept = sensitive + ranked + [n for n in weights if any(fnmatch.fnmatchcase(n, k) for k in p["keep_8bit"])]
                    overrides.update({n: [{"quant_type": QuantType.QInt8, "symmetric": True}] for n in kept})
                config = get_qnn_qdq_config(str(src), _Reader(samples), activation_type=QuantType.QUInt16,
                                            weight_type=getattr(QuantType, precisions.get(p["precision"]).llm_weights), per_channel=True,
                                            init_overrides=overrides or None)
                config.use_external_data_format = True
                if opset < QDQ_OPSET:  # what onnxruntime chooses for the graph as written: the QDQ graphs stay the same
                    config.extra_options["UseQDQContribOps"] = True
                quantize(str(src), str(ctx.tmp_output(f"model:{g.name}")), config)
            finally:
                src.unlink()
            print(f"{g.name}: calibrated on {len(samples)} calls")
            if w4 is not None:
                print(f"{g.name}: {rewrite(ctx.tmp_output(f'model:{g.name}'), model, w4)} weights rewritten")
    if p["precision"] == "auto":
        (ctx.tmp / "auto").mkdir()  # the candidates' graphs, each judged and removed
        ctx.facts["auto"] = _auto(a, p, layout, floats, feeds, mine,
                                  {(g.ar, g.cl): ctx.tmp_output(f"model:{g.name}") for g in mine}, ctx.tmp / "auto")
    share_weights([ctx.tmp_output(f"model:{g.name}") for g in mine], ctx.tmp_output(weights_role(p["part"])))


def past_ranges(feeds: dict[tuple[int, int, int], list[Call]]) -> dict[str, dict[str, np.float32]]:
    """Each past KV input's range over every graph's calls: what the cache holds, whichever graph wrote it. A graph
    calibrated alone sees its own calls' past only, and a prompt graph's calibration prompts fit one window: an
    empty cache, a range of zeros, and then a prompt longer than the window read its first window's cache as
    zeros (SmolLM2-135M at w8a16: perplexity 1.0x the float's on each segment's first 63 tokens, 2-50x on the
    next 64)."""
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for calls in feeds.values():
        for c in calls:
            for name, v in c.inputs.items():
                if name.startswith("past_key_values.") and v.size:
                    lo[name], hi[name] = min(lo.get(name, 0.0), float(v.min())), max(hi.get(name, 0.0), float(v.max()))
    return {n: {"rmin": np.float32(lo[n]), "rmax": np.float32(hi[n])} for n in lo}


def _int4_weights(p: dict[str, Any], floats: dict[tuple[int, int, int], Path],
                  feeds: dict[tuple[int, int, int], list[Call]], mine: list[Any]) -> tuple[Weights4 | None, list[str]]:
    """llm.quantization's weights (None for auto, which chooses its own): each MatMul weight's values and scales from
    the activations of the part's graphs at the smallest CL, per channel (int4 also block-wise), searched or
    min/max, and the weights the sensitivity ranking keeps at int8 (the most sensitive first, up to
    `keep_8bit_share` of the int4 elements).
    int8 weights (w8a16's; w4a16's LM head, keep_8bit and ranked) are rewritten per channel unless `int8: tensor`
    (onnxruntime's QNN config writes every MatMul weight per tensor)."""
    q = p.get("quantization")
    if not q or p["precision"] == "auto":
        return None, []
    graphs, matmuls, kept = _part_weights(p, floats, feeds, mine)
    bits = {w: 8 for w in matmuls} if p["precision"] == "w8a16" else {w: 8 if w in kept else 4 for w in matmuls}
    if q["int8"] == "tensor":
        bits = {w: b for w, b in bits.items() if b == 4}
    start = time.monotonic()
    block = q["block_size"] if q["int4"] == "block" else None
    seen = gather(graphs, set(bits))
    w4 = choose(seen, bits, block, q["scale_search"])
    ranked = ranked_8bit(w4, q["keep_8bit_share"])
    if ranked:  # the ranking's pick at int8 (per channel unless int8: tensor)
        again = choose(seen, {w: 8 for w in ranked}, None, q["scale_search"]) if q["int8"] == "channel" else None
        for w in ranked:
            del w4.chosen[w]
            if again:
                w4.chosen[w] = again.chosen[w]
    print(f"weights: {sum(c.bits == 4 for c in w4.chosen.values())} int4 ({q['int4']}), "
          f"{sum(c.bits == 8 for c in w4.chosen.values())} int8 per channel"
          f"{', scale search' if q['scale_search'] else ''} on {w4.tokens} activation rows in "
          f"{time.monotonic() - start:.1f} s; kept at int8 by the ranking: {', '.join(ranked) or 'none'}")
    print("sensitivity (relative output error, most sensitive first): " + ", ".join(
        f"{r['weight']} int{r['bits']} {r['error']:.2e}" for r in w4.summary()["ranking"]))
    return w4, ranked


def _part_weights(p: dict[str, Any], floats: dict[tuple[int, int, int], Path],
                  feeds: dict[tuple[int, int, int], list[Call]], mine: list[Any]
                  ) -> tuple[list[tuple[Path, list[Call]]], set[str], set[str]]:
    """The part's float graphs at the smallest CL with their calibration calls (the largest AR first), its MatMul
    weights, and those kept at int8 whatever the setting: the LM head and the recipe's keep_8bit."""
    cl = min(g.cl for g in mine)
    graphs = [(floats[(g.part, g.ar, g.cl)], feeds.get((g.part, g.ar, g.cl), []))
              for g in sorted(mine, key=lambda g: -g.ar) if g.cl == cl]
    _, sensitive, _ = _io_and_sensitive(graphs[0][0])
    matmuls = set(matmul_weights(load(graphs[0][0], external_data=False)).values())
    return graphs, matmuls, {w for w in matmuls if w in sensitive or any(fnmatch.fnmatchcase(w, k) for k in p["keep_8bit"])}


def _auto(a: Action, p: dict[str, Any], layout: Layout, floats: dict[tuple[int, int, int], Path],
          feeds: dict[tuple[int, int, int], list[Call]], mine: list[Any], qdq: dict[tuple[int, int], Path],
          tmp: Path) -> dict[str, Any]:
    """precision: auto (llm/auto_precision.py): the cheapest candidate passing the part check's gates and the part's
    share of the quality gates on the CPU, its weights written into the part's QDQ graphs; returns the choice and
    the judged candidates' figures."""
    import json

    from ctxbuild.llm import auto_precision, records

    start = time.monotonic()
    graphs, matmuls, head = _part_weights(p, floats, feeds, mine)
    seen = gather(graphs, matmuls)
    q = p["quantization"]
    cands = auto_precision.candidates(seen, head, q)
    print(f"precision auto: {len(cands)} candidates from {seen.tokens} activation rows in "
          f"{time.monotonic() - start:.1f} s")
    calls = records.read(Path(a.inputs["records"]))
    floats_mine = {(g.ar, g.cl): floats[(g.part, g.ar, g.cl)] for g in mine}
    chained = None
    if "float" in a.inputs:  # the quality gates' share (without verification there is no float export's figures)
        cl = max(k[2] for k in floats)
        gates = auto_precision.share(p["thresholds"], len(layout.parts))
        chained = auto_precision.Chained({k: v for k, v in floats.items() if k[2] == cl}, layout.parts,
                                         (layout.kv_heads, layout.head_dim),
                                         json.loads(Path(a.inputs["float"]).read_text()), p["part"], gates)
        print(f"precision auto: part {p['part'] + 1}'s share of the quality gates: perplexity ratio <= "
              f"{gates['max_ppl_ratio']}, agreement >= {gates['min_agreement']} (the float parts around it)")
    chosen = cands[-1]
    for c in cands:
        t = time.monotonic()
        auto_precision.judge(c, qdq, floats_mine, calls, p["thresholds"], tmp, chained)
        print(f"precision auto: {c.name}: {auto_precision.weight_bytes(c.weights) / 1e6:.3f} MB of MatMul weights, "
              f"{c.figures} on {len(calls)} recorded calls"
              f"{f', in the model {c.quality}' if c.quality else ''}: {'passes' if c.passed else 'fails'} "
              f"({time.monotonic() - t:.1f} s)")
        if c.passed:
            chosen = c
            break
    auto_precision.keep(qdq, floats_mine, chosen)
    print(f"precision auto: part {p['part'] + 1} takes {chosen.name} ({time.monotonic() - start:.1f} s in all)")
    return {"chosen": chosen.name, "seconds": round(time.monotonic() - start, 1),
            "candidates": [{"name": c.name, "weight_bytes": int(auto_precision.weight_bytes(c.weights)),
                            "figures": c.figures, "quality": c.quality, "passed": c.passed}
                           for c in cands if c.figures is not None]}


def share_weights(models: list[Path], weights: Path) -> None:
    """Save the quantized `models` (each with its own data file, as the quantizer wrote it) into the one file
    `weights`: a tensor the graphs hold with the same bytes (the weights, their scales) is stored once."""
    with SharedData(weights) as data:
        for m in models:
            data.save(load(m, external_data=False), m.parent, m)
    per_graph = sum(data_path(m).stat().st_size for m in models if data_path(m).exists())
    for m in models:
        data_path(m).unlink(missing_ok=True)
    print(f"{weights.name}: {weights.stat().st_size} bytes for {len(models)} graphs ({per_graph} apart)")


def adapter_variants(inputs: dict[str, str], floats: dict[tuple[int, int, int], Path], cal: dict[str, Any]
                     ) -> tuple[Bound, list[Bound]]:
    """(each graph's slot defaults, the slot values per calibration variant: no adapter, then each adapter of the
    set bound). A file is checked against the slots of every graph: it holds the whole model's."""
    from ctxbuild.lora.adapters import bind_param, slot_defaults_of, slot_spec

    defaults = {k: slot_defaults_of(path) for k, path in floats.items()}
    spec = slot_spec({n: v for d in defaults.values() for n, v in d.items()})
    variants = [defaults]
    for name, param in sorted(cal.items()):
        values = bind_param(Path(inputs[f"adapter:{name}"]), spec, param)
        variants.append({k: {**d, **{n: v for n, v in values.items() if n in d}} for k, d in defaults.items()})
    return defaults, variants


def _private_copy(model: Path, dst: Path, slots: set[str], data: PrivateData) -> int:
    """`model` at `dst`, its external data shared (`data`'s copies of the files the cache links), at opset 21 and
    without the LoRA slots' defaults (the quantizer would take an initializer for a weight); returns the model's own
    opset. 16-bit activations need opset 21, and onnxruntime's quantizer converts an older model with its weights
    loaded (the version converter and a shape inference round trip each copy them): done here on the graph alone."""
    import onnx

    m = load(model, external_data=False)
    opset = _opset(m)
    if not data.relocate(m, model) and not slots and opset >= QDQ_OPSET:
        os.link(model, dst)
        return opset
    m = at_opset_21(m)
    kept = [t for t in m.graph.initializer if t.name not in slots]
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept)
    onnx.save(m, str(dst))
    return opset


def _opset(m: Any) -> int:
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)


def _io_and_sensitive(path: Path) -> tuple[list[str], list[str], list[str]]:
    """Graph I/O names, the weights of the embedding (Gather by input_ids) and of the LM head (the MatMul
    writing logits), and the weights keep_8bit may choose: the MatMuls' and the embedding's (not a norm's scale:
    the HTP's RmsNorm refuses an int8 symmetric one, 'Failed to add node', onnxruntime-qnn 2.7.0)."""
    m = load(path, external_data=False)
    inits = {t.name for t in m.graph.initializer}
    sensitive = [i for n in m.graph.node for i in n.input if i in inits and (
        (n.op_type == "Gather" and "input_ids" in n.input) or (n.op_type == "MatMul" and "logits" in n.output))]
    weights = {i for n in m.graph.node if n.op_type in ("MatMul", "Gather") for i in n.input if i in inits}
    return [v.name for v in (*m.graph.input, *m.graph.output)], sensitive, sorted(weights)


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over recorded calls, each expanded as it is read."""

    def __init__(self, samples: list[Call]) -> None:
        self._it = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        call = next(self._it, None)
        return call.feeds() if call is not None else None
