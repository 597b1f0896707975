"""Growing the mixed rung's set of nodes kept at higher precision, on the CPU, where quantization loses the
output (the QDQ model on the CPU already misses the thresholds: the simulator came out at most the CPU
screen's margin above it, verify/predict.py).

The diagnosis' culprits are the first round. A loss spread over a whole network is not removed by a handful of
nodes: on the YOLOv8 fall detector at w8a16 every activation is ~20 dB from float and the score slice carries
the sum; the per-node figures of whole tensors do not say which nodes matter for a failing slice. Measured
there (4 samples, the QDQ model on the CPU): 16-bit weights on the head and neck (37 convolutions) left the
score slice at 16.4 dB, on the first 27 (the backbone) 22.4 dB, on the first 32 24.7 dB: a node's noise is
amplified by every node after it, so the rounds grow from the input side. Each round keeps the first
`grown(...)` candidates (the failing outputs' ancestors not yet kept: with 16-bit activations the nodes with
weights, at 16-bit weights; else every node, in fp16), doubling up to MAX_SHARE of the model's nodes of that
kind (more is a uniform candidate's ground), each round quantized for real and measured on the CPU
(actions/culprits.py) until every output and slice clears the thresholds by the screen's margin.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ctxbuild.graph.nodenames import Names
from ctxbuild.recipes.quantization import FP16_NODE
from ctxbuild.verify.advice import WEIGHTED_OPS
from ctxbuild.verify.predict import parts

MAX_SHARE = 0.5  # at most this share of the model's weighted nodes (16-bit weights) or of all its nodes (fp16)


def clears(result: dict[str, Any], thr: dict[str, float], margin_db: float) -> bool:
    """Every output and slice meets the thresholds with `margin_db` to spare (the cosine bar moved as the
    screen moves it: 1 - cosine scales as the error power)."""
    cos_bar = 1 - (1 - thr["min_cosine"]) * 10 ** (-margin_db / 10)
    return all(m["snr_db"] >= thr["min_snr_db"] + margin_db and m["cosine"] >= cos_bar for _, m in parts(result))


def worst(result: dict[str, Any]) -> dict[str, Any]:
    """The worst part of a result: where, SNR and cosine."""
    where, m = min(parts(result), key=lambda p: p[1]["snr_db"])
    return {"where": where, "snr_db": round(m["snr_db"], 2), "cosine": round(m["cosine"], 5)}


def weighted(model: Any) -> list[str]:
    """The nodes whose weights quantization.nodes' {weights: ...} reaches (an initializer weight input)."""
    inits = {i.name for i in model.graph.initializer}
    return _users(model, [n for n in model.graph.node
                          if n.op_type in WEIGHTED_OPS and len(n.input) > 1 and n.input[1] in inits])


def _one_setting(model: Any, nodes: dict[str, Any], fix: Any) -> dict[str, Any]:
    """`nodes` with one setting for the names of one prepared node (a MatMul and its bias Add fused into a Gemm: the
    diagnosis may name one, the pool the other; quantize refuses two settings for one node): `fix` when any of
    them has it, else the first name's."""
    names = Names(model)
    group: dict[str, str] = {}  # prepared node -> the first name standing for it
    out = dict(nodes)
    for name in nodes:
        for p in names.resolve(name) or []:
            lead = group.setdefault(p, name)
            if lead != name and out[lead] != out[name]:
                out[lead] = out[name] = fix if fix in (out[lead], out[name]) else out[lead]
    return out


def _users(model: Any, nodes: list[Any]) -> list[str]:
    """The user's names for these prepared nodes (graph/nodenames.py; an unnamed one by its first output), each
    once, in order."""
    label = Names(model).label
    return list(dict.fromkeys(label(n) for n in nodes))


def ancestors(model: Any, outputs: set[str]) -> list[str]:
    """The nodes computing `outputs`, in topological (the model's) order, by the user's names."""
    nodes = list(model.graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    seen: set[int] = set()
    todo = [producer[o] for o in outputs if o in producer]
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        todo += [producer[t] for t in nodes[i].input if t in producer]
    return _users(model, [n for i, n in enumerate(nodes) if i in seen])


def sizes(pool: int, bound: int) -> list[int]:
    """How many of the `pool` candidates each growing round keeps: doubling from a quarter of the bound up to
    the bound (or the whole pool)."""
    top = min(pool, bound)
    return sorted({max(1, top // 4), max(1, top // 2), top}) if top > 0 else []


def grow(model: Any, first: dict[str, Any], outputs: set[str], wide: bool,
         measure: Callable[[dict[str, Any]], dict[str, Any]], thr: dict[str, float],
         margin_db: float) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
    """(the nodes kept, the rounds, why it stopped short or None). `model`: the prepared model (no weights
    needed); `first`: quantization.nodes from the diagnosis (round 1); `outputs`: the failing outputs;
    `wide`: 16-bit weights are the fix (16-bit activations, the target runs them), else fp16; `measure`:
    quantization.nodes -> the QDQ model's CPU result (outputs with slices, as the screen's). When no round
    clears, the best one measured is the answer (the simulator still verifies it). Every set names the
    user's nodes (graph/nodenames.py), as the answer the recipe can pin."""
    fix: Any = {"weights": "int16"} if wide else FP16_NODE
    kind = weighted(model) if wide else _users(model, list(model.graph.node))
    bound = int(len(kind) * MAX_SHARE)
    pool = [n for n in ancestors(model, outputs) if n in set(kind) and n not in first]
    rounds: list[dict[str, Any]] = []
    tried: list[tuple[float, dict[str, Any]]] = []
    kept = 0
    for k in [0, *sizes(len(pool), bound - sum(1 for n in first if n in set(kind)))]:
        nodes = dict(sorted(_one_setting(model, {**first, **{n: fix for n in pool[:k]}}, fix).items()))
        start = time.monotonic()
        got = measure(nodes)
        row = worst(got)
        rounds.append({"round": len(rounds) + 1, "added": sorted(first) if not rounds else pool[kept:k],
                       "fp16": sum(v == FP16_NODE for v in nodes.values()),
                       "int16_weights": sum(v != FP16_NODE and v.get("weights") == "int16" for v in nodes.values()),
                       **row, "seconds": round(time.monotonic() - start, 1)})
        kept = k
        if clears(got, thr, margin_db):
            return nodes, rounds, None
        tried.append((row["snr_db"], nodes))
    last = rounds[-1]
    what = "16-bit weights" if wide else "fp16"
    return max(tried, key=lambda t: t[0])[1], rounds, (
        f"the mixed rung stopped at its bound ({what} on at most {MAX_SHARE:.0%} of the model's "
        f"{'weighted ' if wide else ''}nodes, {bound} of {len(kind)}): {last['where']} at {last['snr_db']} dB")
