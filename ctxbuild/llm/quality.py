"""What a build costs an LLM, in the terms its users judge it by: the perplexity of a text and the tokens it
generates, each against the float export.

Perplexity: the text tokenized with the export's tokenizer, cut into segments of one context length (non-overlapping;
each read from an empty cache, its first token predicted by nothing), exp(mean negative log-likelihood of every other
token). The float export runs each segment in one call; the static parts (QDQ on the CPU, twins on the simulator) run
it as a device does, in windows of the largest AR through every part, the KV cache carried between windows.

Agreement: the float export's greedy continuation of each prompt; the parts teacher-forced on it (every step sees the
float model's history), the share of steps whose top-1 token is the float's. The first step where it is not is where a
free-running greedy decode diverges (before it, the two histories are the same).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.llm.pipeline import Chain, Runner, export_call, open_export
from ctxbuild.figures import over, under


def segments(ids: np.ndarray, length: int, limit: int | None = None) -> list[np.ndarray]:
    """`ids` in consecutive segments of `length` tokens (a shorter last one kept if it has 2 or more); the first
    `limit`."""
    segs = [ids[i:i + length] for i in range(0, len(ids), length)]
    segs = [s for s in segs if len(s) >= 2]
    return segs[:limit] if limit is not None else segs


def nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target under its row of logits ([n, vocab], [n]), in float64."""
    x = logits.astype(np.float64)
    top = x.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(x - top).sum(axis=1))
    return lse - x[np.arange(len(targets)), targets]


def export_nll(model: Path, segs: list[np.ndarray], opened: tuple[Any, dict[str, np.ndarray]] | None = None
               ) -> list[np.ndarray]:
    """Per segment, the float export's NLL of its tokens 1..n-1 (one call each, an empty cache). `opened`: its
    InferenceSession (pipeline.open_export), reused."""
    s, past = opened or open_export(model)
    return [nll(export_call(s, seg[None].astype(np.int64), 0, past)["logits"][0, :-1], seg[1:]) for seg in segs]


def static_nll(run: Runner, parts: list[tuple[int, int]], kv_shape: tuple[int, int], segs: list[np.ndarray],
               cl: int, ar: int) -> list[np.ndarray]:
    """Per segment, the chained static parts' NLL of its tokens 1..n-1 (windows of `ar`, the cache carried)."""
    return [nll(Chain(run, parts, kv_shape, cl).prefill(seg, ar)[:-1], seg[1:]) for seg in segs]


def perplexity(nlls: list[np.ndarray] | list[dict[str, float]]) -> float:
    """exp(mean NLL) over every token of the segments (NLL arrays, or their {"nll_sum", "count"} summaries)."""
    sums = [summary(x) if isinstance(x, np.ndarray) else x for x in nlls]
    return float(np.exp(sum(s["nll_sum"] for s in sums) / sum(s["count"] for s in sums)))


def summary(x: np.ndarray) -> dict[str, float]:
    return {"nll_sum": float(x.sum()), "count": int(len(x))}


def agreement(reference: list[list[int]], forced: list[list[np.ndarray]]) -> dict[str, Any]:
    """Top-1 agreement of teacher-forced logits with the reference tokens, pooled; the first divergence per prompt
    (None: none within the steps compared)."""
    agree, first = [], []
    for ref, logits in zip(reference, forced):
        same = [int(g.argmax()) == t for g, t in zip(logits, ref)]
        agree += same
        first.append(next((i for i, s in enumerate(same) if not s), None))
    return {"steps": len(agree), "agreement": round(float(np.mean(agree)), 4) if agree else None,
            "first_divergence": first}


def decode(tokenizer: Path | None, ids: list[int]) -> str | None:
    """Token ids as text with the export's tokenizer.json (None without one)."""
    if tokenizer is None:
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer)).decode(ids)


def failures(measured: dict[str, dict[str, Any]], t: dict[str, float]) -> list[str]:
    """The gates: per backend (its label -> {"ppl_ratio", "agreement", "steps", "tokens"}), perplexity within
    `max_ppl_ratio` of the float export's and top-1 agreement at least `min_agreement`; one line each that fails."""
    out = []
    for label, m in measured.items():
        ratio, agree = m.get("ppl_ratio"), m.get("agreement")
        if ratio is not None and not ratio <= t["max_ppl_ratio"]:  # NaN fails too
            out.append(f"{label}: perplexity {over(ratio, t['max_ppl_ratio'], 3)}x the float export's "
                       f"(max {t['max_ppl_ratio']}) over {m['tokens']} tokens")
        if agree is not None and not agree >= t["min_agreement"]:
            out.append(f"{label}: greedy agreement {under(agree, t['min_agreement'], 2)} (min {t['min_agreement']}) "
                       f"over {m['steps']} steps")
    return out


def meets(m: dict[str, Any], t: dict[str, float]) -> bool:
    """Whether one backend's figures (ppl_ratio, agreement) pass the gates `failures` applies."""
    return not failures({"": m}, t)


def measure(run: Runner, parts: list[tuple[int, int]], kv_shape: tuple[int, int], floats: dict[str, Any], cl: int,
            ar: int, subset: dict[str, int] | None = None, free: bool = False) -> dict[str, Any]:
    """The chained parts behind `run` against the float export's figures (llm_float_eval's result): perplexity and
    its ratio, teacher-forced agreement and first divergences, and with `free` each prompt's own greedy tokens.
    `subset` (the simulator's): the perplexity of the first `windows` windows of `ar` tokens of the text, the first
    `prompts` prompts and `tokens` steps of each.
    Everything at the largest AR runs first (the text's windows, every prompt), then every token step at AR 1: a
    runner holding one AR's sessions at a time (llm/ar_sessions.py) switches once."""
    subset = subset or {}
    segs = [np.array(s, np.int64) for s in floats["text"]["segments"]]
    if "windows" in subset:  # the first segment's first windows of `ar` tokens, against the float NLL of those tokens
        segs = [segs[0][:subset["windows"] * ar]] if subset["windows"] and segs else []
        refs: list[Any] = [np.array(floats["first_nll"][:len(segs[0]) - 1])] if segs else []
    else:
        segs = segs[:subset.get("segments")]
        refs = floats["by_segment"][:len(segs)]
    out: dict[str, Any] = {"ppl": None, "float_ppl": None, "ppl_ratio": None, "tokens": 0, "segments": len(segs)}
    if segs and len(segs[0]) >= 2:
        ppl, ref = perplexity(static_nll(run, parts, kv_shape, segs, cl, ar)), perplexity(refs)
        out.update(ppl=round(ppl, 4), float_ppl=round(ref, 4), ppl_ratio=round(ppl / ref, 4),
                   tokens=sum(len(s) - 1 for s in segs))
    prompts = floats["prompts"][:subset.get("prompts")]
    tokens = [p["tokens"][:subset.get("tokens")] for p in prompts]
    # per prompt a teacher-forced chain (and a free one): each prefilled at the largest AR, then stepped at AR 1
    chains = [(t, Chain(run, parts, kv_shape, cl)) for t in tokens] + \
        ([(None, Chain(run, parts, kv_shape, cl)) for _ in prompts] if free else [])
    ids = [np.array(p["ids"], np.int64) for p in prompts]
    last = [c.prefill(ids[i % len(prompts)], ar)[-1] for i, (_, c) in enumerate(chains)]
    logits: list[list[np.ndarray]] = [[] for _ in chains]
    taken: list[list[int]] = [[] for _ in chains]
    for i, (forced, c) in enumerate(chains):
        want = len(forced) if forced is not None else len(prompts[i % len(prompts)]["tokens"])
        for s in range(want):
            logits[i].append(last[i])
            taken[i].append(forced[s] if forced is not None else int(last[i].argmax()))
            if s < want - 1:
                last[i] = c.step(np.array([taken[i][-1]]), 1)[-1]
    out.update(agreement(tokens, logits[:len(tokens)]))
    if free:
        out["generated"] = taken[len(tokens):]
    return out
