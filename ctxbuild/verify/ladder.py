"""Walking a precision-search ladder for one target: which candidates ran, which passed, which the CPU
screen rejected, and where the search stopped. The `search_step` gates and the `select` decision are both
this one function over the results known so far, so they cannot disagree.

Row states: `passed`, `failed` (measured on the simulator), `rejected_cpu` (the QDQ model on the CPU EP
already missed the thresholds by more than the margin: never compiled), `predicted_fail` (an earlier weights-only
variant's HTP loss leaves it no chance, or it failed on a sibling SoC's simulator: never compiled; the rules are
in verify/predict.py), `refused` (QNN would
not compile it), `not_run` (an earlier candidate passed, or the search stopped as hopeless), `pending` (the walk
has reached a candidate whose results are not known yet: the gates' question). The fp16 rung, last, has no
CPU screen: its rows come from its simulator run alone; it runs when every integer candidate before it failed
or was skipped. A row predicted from a sibling SoC names it (`predicted_by`); a measured row contradicting a
sibling's run of the same candidate says how (`disagrees`), and the sibling rule is off after it.
"""
from __future__ import annotations

from typing import Any

from ctxbuild.graph.cut import DATA_DEPENDENT_OPS
from ctxbuild.recipes.quantization import FP16_RUNG
from ctxbuild.verify.gates import is_skipped
from ctxbuild.verify.measure import failures
from ctxbuild.verify.predict import (carried_htp_loss, cpu_rejection, measured, sibling_disagreement,
                                     sibling_failure)


def stuck_ops(refused: dict[str, Any]) -> set[str]:
    """The op types of a refusal no quantization rung changes: control flow and data-dependent shapes (QNN has
    neither; graph/cut.py keeps the list)."""
    return {op for _, op in refused.get("nodes") or []} & DATA_DEPENDENT_OPS


def hopeless(refused: dict[str, Any]) -> str | None:
    """A refusal no later rung can change: QNN refused a control-flow or data-dependent node (the nodes fed by
    its dynamic shape are refused with it), and with the whole graph on the NPU every rung fails on it."""
    if stuck := stuck_ops(refused):
        return f"QNN cannot run {', '.join(sorted(stuck))} at any precision"
    return None


def walk(names: list[str], screens: dict[str, Any], verifies: dict[str, Any], thr: dict[str, float],
         predict: dict[str, Any], siblings: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per candidate in ladder order. `screens`/`verifies`: name -> result, for the candidates whose
    results are known; the walk ends `pending` at the first one it needs and does not have. `predict`: the
    skipping rules' parameters (verify/predict.rules). `siblings`: earlier targets of the recipe -> their
    verifies (known so far), whose failures this target skips."""
    rows: list[dict[str, Any]] = []
    stop: str | None = None
    trusted = dict(siblings or {})
    for n in names:
        if stop:
            rows.append({"name": n, "state": "not_run", "why": stop})
            continue
        if n not in screens and n != FP16_RUNG["name"]:  # the fp16 rung is not quantized: it has no screen
            rows.append({"name": n, "state": "pending", "why": "needs its CPU screen"})
            break
        screen = screens.get(n)
        if is_skipped(screen):  # its gate closed though the walk reached it: the mixed rung found nothing to change
            unmeasured = rows and all((screens.get(r["name"]) or {}).get("error") for r in rows)
            rows.append({"name": n, "state": "not_run",
                         "why": "not run: no candidate before it could be measured to diagnose" if unmeasured
                         else "not run: the diagnosis blamed no node"})
            continue
        if screen is not None and (why := cpu_rejection(screen, thr, predict["cpu_margin_db"])):
            rows.append({"name": n, "state": "rejected_cpu", "why": why})
            continue
        # the HTP losses measured here, and on the trusted siblings where this target skipped the candidate (its
        # own result: a placeholder)
        sources = {a: soc for soc, vs in trusted.items() for a, v in vs.items()
                   if measured(v) and not measured(verifies.get(a))}
        seen = {**verifies, **{a: trusted[soc][a] for a, soc in sources.items()}}
        if carried := carried_htp_loss(n, [r["name"] for r in rows], screens, seen, thr, predict, sources):
            rows.append({"name": n, "state": "predicted_fail", "why": carried[1],
                         **({"predicted_by": sources[carried[0]]} if carried[0] in sources else {})})
            continue
        if trusted and (hit := sibling_failure(n, trusted, thr)):
            rows.append({"name": n, "state": "predicted_fail", "why": hit[1], "predicted_by": hit[0]})
            continue
        if n not in verifies:
            rows.append({"name": n, "state": "pending", "why": "needs its simulator run"})
            break
        v = verifies[n]
        if is_skipped(v):  # a walk without the siblings that closed its gate (the mixed rung's diagnosis)
            rows.append({"name": n, "state": "not_run", "why": "not run: skipped on a sibling SoC's measurement"})
            continue
        if refused := v.get("compile_refused"):
            rows.append({"name": n, "state": "refused", "why": refused["error"]})
            if stuck := hopeless(refused):
                stop = f"not run: the search stopped at {n}: {stuck}"
            continue
        found = failures({**v, "thresholds": thr})
        rows.append({"name": n, "state": "failed" if found else "passed", "failures": found})
        if trusted and (odd := sibling_disagreement(n, v, trusted, thr, predict["sibling_tolerance_db"])):
            rows[-1]["disagrees"] = odd
            trusted = {}
        if not found:
            stop = f"not run: {n} passed"
    return rows


def state_of(rows: list[dict[str, Any]], name: str) -> str:
    """A candidate's state; `unknown` past the first pending one (its gate's inputs are not all known)."""
    return next((r["state"] for r in rows if r["name"] == name), "unknown")

