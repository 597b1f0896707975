"""Token-level comparison of a pipeline against the float one: the float static graphs decode greedily, the
other pipeline is teacher-forced on the float's tokens, and each step's logits are compared: top-1 agreement,
cosine, SQNR, and the first step whose top-1 differs (where a free-running greedy decode would diverge)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.llm.layout import Layout
from ctxbuild.llm.pipeline import Decoded, Runner, generate


def float_runs(layout: Layout, run: Runner, prompts: list[np.ndarray], tokens: int, cl: int) -> list[Decoded]:
    ar = max(g.ar for g in layout.graphs)
    return [generate(run, layout.parts, (layout.kv_heads, layout.head_dim), p, tokens, cl, ar) for p in prompts]


def forced_logits(layout: Layout, run: Runner, prompts: list[np.ndarray], reference: list[Decoded], cl: int) -> list[list[np.ndarray]]:
    ar = max(g.ar for g in layout.graphs)
    return [generate(run, layout.parts, (layout.kv_heads, layout.head_dim), p, len(r.tokens), cl, ar,
                     forced=r.tokens).logits for p, r in zip(prompts, reference)]


def compare(reference: list[Decoded], got: list[list[np.ndarray]]) -> dict[str, Any]:
    agree, cosines, first = [], [], []
    err = sig = 0.0
    for ref, logits in zip(reference, got):
        div = None
        for s, (r, g) in enumerate(zip(ref.logits, logits)):
            r64, g64 = r.astype(np.float64), g.astype(np.float64)
            same = int(g64.argmax()) == ref.tokens[s]
            agree.append(same)
            if not same and div is None:
                div = s
            cosines.append(float(r64 @ g64 / max(np.linalg.norm(r64) * np.linalg.norm(g64), 1e-30)))
            err += float((r64 - g64) @ (r64 - g64))
            sig += float(r64 @ r64)
        first.append(div)
    return {"steps": len(agree), "token_agreement": round(float(np.mean(agree)), 4),
            "cosine_mean": round(float(np.mean(cosines)), 6), "cosine_min": round(float(np.min(cosines)), 6),
            "sqnr_db": round(10 * float(np.log10(sig / err)), 2) if err > 0 else None,
            "first_divergence": first}
