"""Walking a precision-search ladder for one target: which candidates ran, which passed, which the CPU
screen rejected, and where the search stopped. The `search_step` gates and the `select` decision are both
this one function over the results known so far, so they cannot disagree.

Row states: `passed`, `failed` (measured on the simulator), `rejected_cpu` (the QDQ model on the CPU EP
already missed the thresholds by more than plan/search.CPU_MARGIN_DB: never compiled), `refused` (QNN would not compile
it), `not_run` (an earlier candidate passed, or the search stopped as hopeless), `pending` (the walk has
reached a candidate whose results are not known yet: the gates' question). The fp16 rung, last, has no
CPU screen: its rows come from its simulator run alone.
"""
from __future__ import annotations

from typing import Any

from ctxbuild.recipes.quantization import FP16_RUNG
from ctxbuild.verify.gates import is_skipped
from ctxbuild.verify.measure import failures


# Ops whose refusal no quantization rung changes: control flow and data-dependent shapes (QNN has neither).
STRUCTURAL_OPS = frozenset({"If", "Loop", "Scan", "NonZero", "Unique", "RandomNormal", "RandomNormalLike",
                            "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"})


def cpu_rejection(screen: dict[str, Any], thr: dict[str, float], margin_db: float) -> str | None:
    """Why the CPU screen rejects a candidate, or None. The cosine bar moves with the same margin: for small
    errors 1 - cosine scales as the error power, i.e. as 10^(-SNR/10). A candidate onnxruntime cannot run is
    rejected with onnxruntime's reason."""
    if error := screen.get("error"):
        return f"rejected on CPU ({error})"
    worst = None
    for name, m in screen["outputs"].items():
        snr_bar = thr["min_snr_db"] - margin_db
        cos_bar = 1 - (1 - thr["min_cosine"]) * 10 ** (margin_db / 10)
        if not (m["snr_db"] >= snr_bar and m["cosine"] >= cos_bar) and (worst is None or m["snr_db"] < worst[1]):
            worst = (name, m["snr_db"], m["cosine"])
    if worst is None:
        return None
    return f"rejected on CPU ({worst[1]:.1f} dB, cosine {worst[2]:.4f} at output '{worst[0]}')"


def hopeless(refused: dict[str, Any]) -> str | None:
    """A refusal no later rung can change: QNN refused a control-flow or data-dependent node (the nodes fed by
    its dynamic shape are refused with it), and with the whole graph on the NPU every rung fails on it."""
    stuck = {op for _, op in refused.get("nodes") or []} & STRUCTURAL_OPS
    if stuck:
        return f"QNN cannot run {', '.join(sorted(stuck))} at any precision"
    return None


def walk(names: list[str], screens: dict[str, Any], verifies: dict[str, Any], thr: dict[str, float],
         margin_db: float) -> list[dict[str, Any]]:
    """One row per candidate in ladder order. `screens`/`verifies`: name -> result, for the candidates whose
    results are known; the walk ends `pending` at the first one it needs and does not have."""
    rows: list[dict[str, Any]] = []
    stop: str | None = None
    for n in names:
        if stop:
            rows.append({"name": n, "state": "not_run", "why": stop})
            continue
        if n not in screens and n != FP16_RUNG["name"]:  # the fp16 rung is not quantized: it has no screen
            rows.append({"name": n, "state": "pending", "why": "needs its CPU screen"})
            break
        screen = screens.get(n)
        if is_skipped(screen):  # its gate closed though the walk reached it: the mixed rung found nothing to change
            rows.append({"name": n, "state": "not_run", "why": "not run: the diagnosis blamed no node"})
            continue
        if screen is not None and (why := cpu_rejection(screen, thr, margin_db)):
            rows.append({"name": n, "state": "rejected_cpu", "why": why})
            continue
        if n not in verifies:
            rows.append({"name": n, "state": "pending", "why": "needs its simulator run"})
            break
        v = verifies[n]
        if refused := v.get("compile_refused"):
            rows.append({"name": n, "state": "refused", "why": refused["error"]})
            if stuck := hopeless(refused):
                stop = f"not run: the search stopped at {n}: {stuck}"
            continue
        found = failures({**v, "thresholds": thr})
        rows.append({"name": n, "state": "failed" if found else "passed", "failures": found})
        if not found:
            stop = f"not run: {n} passed"
    return rows


def state_of(rows: list[dict[str, Any]], name: str) -> str:
    """A candidate's state; `unknown` past the first pending one (its gate's inputs are not all known)."""
    return next((r["state"] for r in rows if r["name"] == name), "unknown")

