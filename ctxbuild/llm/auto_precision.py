"""`precision: auto` for llm recipes: per part, the cheapest weight setting whose QDQ graphs keep the part's outputs
within the part check's gates on the recorded calls, and keep the model within the part's share of the quality
gates, on the CPU.

Candidates, cheapest first (weight bytes): w4a16 block-wise, w4a16 per channel, mixed (block-wise with the
sensitivity ranking's share at int8), w8a16 per channel; every one with the scale search, the LM head int8 per
channel. They differ in the MatMul weights only: the part is calibrated and quantized once (uint16 activations,
the ranges onnxruntime's calibration found on the float model do not depend on the weights), the float weights and
their activations are gathered once (int4_graph.Seen), and each candidate is the same QDQ graphs with its weights
rewritten (int4_graph.rewrite), run on the CPU on the part's recorded calls (the split's records: the float outputs
are recorded there) and compared as llm_part_eval compares them.

A candidate passing those is then judged as the model's users judge it (llm/quality.py): the float export's text
and prompts (llm_float_eval's result) through the float static parts with this part's candidate in its place, its
perplexity ratio and teacher-forced agreement against the part's share of `max_ppl_ratio` and `min_agreement`
(`share`: parts choose side by side, each unaware of the others' choice; log-perplexity increases and flipped
tokens add up roughly over parts, so each part gets an equal share of both). The first candidate that passes is
kept; none: w8a16, which the part check and the quality gates then judge like any build. The simulator checks the
chosen graphs afterwards (llm_part_eval, llm_quality)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.graph.modelio import data_path
from ctxbuild.llm import pipeline, records
from ctxbuild.llm.int4_graph import Seen, Weights4, choose, ranked_8bit, rewrite

MIXED_SHARE = 0.25  # the mixed candidate's int8 share of the int4 elements unless llm.quantization.keep_8bit_share


@dataclass
class Candidate:
    name: str
    weights: Weights4
    figures: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None  # with the float parts around it (Chained), where it passed the part gates
    passed: bool = False


def share(thresholds: dict[str, float], parts: int) -> dict[str, float]:
    """One part's share of the model's quality gates (the docstring): ratio ** (1 / parts), 1 - (1 - agreement) / parts."""
    return {"max_ppl_ratio": round(thresholds["max_ppl_ratio"] ** (1 / parts), 6),
            "min_agreement": round(1 - (1 - thresholds["min_agreement"]) / parts, 6)}


@dataclass
class Chained:
    """What the quality judgement chains a candidate's graphs with: every part's float static graphs at the largest
    CL (part, AR, CL) -> path, the layout's parts and KV shape, the float export's figures, the part and its share."""
    floats: dict[tuple[int, int, int], Path]
    parts: list[tuple[int, int]]
    kv_shape: tuple[int, int]
    reference: dict[str, Any]
    part: int
    gates: dict[str, float]

    def judge(self, mine: dict[tuple[int, int], Path]) -> dict[str, Any]:
        """The chain's perplexity ratio and agreement with `mine` ((AR, CL) -> QDQ graph) for the part; "passed"."""
        from ctxbuild.llm import quality
        from ctxbuild.llm.ar_sessions import one_ar_runner

        cl = max(k[2] for k in self.floats)
        models = {k: v for k, v in self.floats.items() if k[0] != self.part}
        models.update({(self.part, ar, cl_): m for (ar, cl_), m in mine.items() if cl_ == cl})
        m = quality.measure(one_ar_runner(models), self.parts, self.kv_shape, self.reference, cl,
                            max(k[1] for k in models))
        out = {k: m[k] for k in ("ppl_ratio", "agreement", "tokens", "steps")}
        out["passed"] = quality.meets(m, self.gates)
        return out


def candidates(seen: Seen, head: set[str], q: dict[str, Any]) -> list[Candidate]:
    """The candidates of the docstring, cheapest first: `head`, the weights kept at int8 in every candidate."""
    int4 = {w: 8 if w in head else 4 for w in seen.arrays}
    block = choose(seen, int4, q["block_size"], True)
    channel = choose(seen, int4, None, True)
    int8 = choose(seen, {w: 8 for w in seen.arrays}, None, True)
    ranked = ranked_8bit(block, q["keep_8bit_share"] or MIXED_SHARE)
    mixed = Weights4({w: int8.chosen[w] if w in ranked else c for w, c in block.chosen.items()}, seen.tokens)
    return [Candidate(f"w4a16 block {q['block_size']}", block), Candidate("w4a16 per channel", channel),
            Candidate(f"w4a16 block {q['block_size']}, {len(ranked)} most sensitive int8", mixed),
            Candidate("w8a16 per channel", int8)]


def weight_bytes(w: Weights4) -> float:
    return sum(c.values.size * c.bits / 8 for c in w.chosen.values())


def judge(c: Candidate, qdq: dict[tuple[int, int], Path], floats: dict[tuple[int, int], Path], calls: list[records.Call],
          thresholds: dict[str, float], tmp: Path, chained: Chained | None = None) -> None:
    """`c`'s figures on the calls (each graph `qdq[(ar, cl)]` rewritten into `tmp`) and whether they pass; passing,
    its figures in the `chained` model (None: no quality judgement, the part gates alone)."""
    mine: dict[tuple[int, int], Path] = {}
    for key, path in qdq.items():
        dst = tmp / path.name
        rewrite(path, floats[key], c.weights, dst)
        mine[key] = dst
    got: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for cl in sorted({k[1] for k in mine}):  # one CL's sessions at a time
        run = pipeline.cpu_runner({(0, ar, cl_): m for (ar, cl_), m in mine.items() if cl_ == cl})
        for call in (c_ for c_ in calls if c_.cl == cl):
            out = run(0, call.ar, call.cl, call.feeds())
            for name, want in call.outputs.items():
                got.setdefault(name, []).append((records.compared(name, out[name], call.valid), want))
    c.figures = _figures(got)
    c.passed = (c.figures["cosine"] >= thresholds["min_cosine"]
                and c.figures.get("agreement", 1.0) >= thresholds["min_token_agreement"]
                and c.figures["kv_cosine"] >= thresholds.get("min_kv_cosine", -1.0))
    if c.passed and chained is not None:
        c.quality = chained.judge(mine)
        c.passed = c.quality["passed"]
    for path in mine.values():
        path.unlink()
        data_path(path).unlink(missing_ok=True)


def _figures(got: dict[str, list[tuple[np.ndarray, np.ndarray]]]) -> dict[str, Any]:
    """The worst cosine of the hidden-state and logits outputs, of the KV outputs, and the logits' top-1 agreement
    (the last valid row of each call, as the part check counts it)."""
    def cos(pairs: list[tuple[np.ndarray, np.ndarray]]) -> float:
        a = np.concatenate([g.ravel() for g, _ in pairs]).astype(np.float64)
        b = np.concatenate([w.ravel() for _, w in pairs]).astype(np.float64)
        return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))

    main = {n: cos(p) for n, p in got.items() if not n.startswith("present.")}
    kv = {n: cos(p) for n, p in got.items() if n.startswith("present.")}
    out: dict[str, Any] = {"cosine": round(min(main.values()), 6), "worst": min(main, key=main.get),
                           "kv_cosine": round(min(kv.values(), default=1.0), 6)}
    if "logits" in got:
        out["agreement"] = round(float(np.mean([g.argmax() == w.argmax() for g, w in got["logits"]])), 4)
    return out


def keep(chosen: dict[tuple[int, int], Path], floats: dict[tuple[int, int], Path], c: Candidate) -> None:
    """The chosen candidate's weights into the action's QDQ graphs (in place)."""
    for key, path in chosen.items():
        rewrite(path, floats[key], c.weights)
