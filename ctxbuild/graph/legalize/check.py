"""The sample check of the rewrites: how far a rule's rewrite moved a model's outputs, and how far it may.

prepare runs the model before and after the rules on onnxruntime's CPU EP in fp32 on the recipe's samples
(verify.dir, else calibration.dir, else seeded random inputs) and applies only the rules whose rewrites keep
every output within the rule's tolerance of what it was (actions/prepare.py), or, for a rule with MIN_SNR_DB
(qdq_bias), every output at that SNR against what it was. The static conditions in the rules prove what the
graph can show; this catches what only values show (attention scores 100 apart under mask_fill)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# Relative max abs: max |after - before| over the larger of the two outputs' largest magnitudes. The exact rules
# move float32 outputs by rounding only (measured: <= 4e-6 on the real exports, docs/legalization.md).
TOLERANCE = 1e-4


def tolerance(rule: str) -> float:
    """The rule's own TOLERANCE where its rewrite is not meant to keep the outputs to float precision."""
    return getattr(_rule(rule), "TOLERANCE", TOLERANCE)


def min_snr_db(rule: str) -> float | None:
    """The rule's MIN_SNR_DB when it is judged by the outputs' SNR instead (qdq_bias: a rewrite within a
    quantized model's own rounding, whose one-step flips a quantized network carries to its outputs)."""
    return getattr(_rule(rule), "MIN_SNR_DB", None)


def _rule(name: str) -> Any:
    from ctxbuild.graph.legalize import RULES

    return next(r for r in RULES if r.NAME == name)


def moved(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> tuple[float, str]:
    """How far `after` (outputs by name, samples concatenated) is from `before`: the largest relative max abs
    over the outputs (inf for a changed shape or type, NaNs in other places, changed integers) and what it is."""
    import numpy as np

    worst, what = 0.0, "no outputs"
    for name, a in before.items():
        b = after.get(name)
        if b is None or b.shape != a.shape or b.dtype != a.dtype:
            got = "none" if b is None else f"{b.dtype} {list(b.shape)}"
            return float("inf"), f"output '{name}' is {got} where it was {a.dtype} {list(a.shape)}"
        if a.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                return float("inf"), f"output '{name}' changed in {int((a != b).sum())} of {a.size} values"
            continue
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        if (nan_a != nan_b).any():
            return float("inf"), (f"output '{name}' is NaN in {int(nan_b.sum())} values where it was NaN in "
                                  f"{int(nan_a.sum())}")
        fa, fb = np.where(nan_a, 0, a).astype(np.float64), np.where(nan_b, 0, b).astype(np.float64)
        with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity: equal, not NaN
            diff = float(np.where(fa == fb, 0.0, np.abs(fa - fb)).max(initial=0))
        scale = max(float(np.abs(x[np.isfinite(x)]).max(initial=0)) for x in (fa, fb))
        rel = diff / scale if scale else (0.0 if diff == 0 else float("inf"))
        if rel >= worst:
            worst, what = rel, f"output '{name}' moved by {diff:.3g}, {rel:.2g} of its largest value {scale:.3g}"
    return worst, what


def snr_db(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> tuple[float, str]:
    """The lowest SNR of `after` against `before` over the float outputs (10 log10 of the signal's energy over
    the difference's; inf where they are equal) and what it is; -inf for a changed shape, type or NaN."""
    import numpy as np

    worst, what = float("inf"), "no outputs"
    for name, a in before.items():
        b = after.get(name)
        if b is None or b.shape != a.shape or b.dtype != a.dtype or (np.isnan(a) != np.isnan(b)).any():
            return float("-inf"), f"output '{name}' changed shape, type or NaNs"
        if a.dtype.kind not in "fc":
            continue
        fa, fb = np.nan_to_num(a.astype(np.float64)), np.nan_to_num(b.astype(np.float64))
        noise, signal = float(((fa - fb) ** 2).sum()), float((fa ** 2).sum())
        snr = float("inf") if noise == 0 else 10 * np.log10(signal / noise) if signal else float("-inf")
        if snr <= worst:
            worst, what = snr, f"output '{name}' at SNR {snr:.1f} dB against before"
    return worst, what
