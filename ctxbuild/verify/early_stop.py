"""Stopping a failing verification early, with a proof: after i of n samples, the best the metrics can
still reach over all n (measure.metrics computes them over the samples concatenated) is bounded by
assuming the remaining samples come out exact. When that best is under a threshold for any output, the
verification fails whatever the rest does, and the simulator stops. A passing run is never stopped.

Per output, with r the float reference (all n samples known: the CPU ran them first), g the simulator's
outputs so far, `done` the first i samples, `rest` the others:
- SNR = 10 log10(|r|^2 / |r - g|^2) <= 10 log10(|r|^2 / |r_done - g_done|^2): the error so far only grows;
- cosine = r.g / (|r||g|): maximising over g_rest gives sqrt(max(r_done.g_done, 0)^2 / |g_done|^2 +
  |r_rest|^2) / |r| (g_rest parallel to r_rest, scaled by |g_done|^2 / r_done.g_done).
The metrics are rounded (cosine 6 digits, SNR 3 decimals) before the comparison, so the bound must clear
the threshold by more than the rounding. A slice of an output that verification measures on its own
(verify/slices.py: a YOLO head's scores beside its boxes) is bounded the same way: it is a part of every
sample's output, and its own metrics must pass too.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

_ZERO_POWER = 1e-20  # as measure.py: below it a reference is treated as zero and no bound is claimed
_COS_SLACK, _SNR_SLACK = 1e-6, 1e-3


Part = tuple[str, int, int, int]  # output, axis, start, stop: a slice of that output (axis -1: the whole output)


def _take(sample: np.ndarray, part: Part) -> np.ndarray:
    import numpy as np

    _, axis, start, stop = part
    return sample if axis < 0 else np.take(sample, range(start, stop), axis=axis)


class EarlyStop:
    """`reference`: output -> the float outputs of all `n` samples, concatenated along axis 0. `slices`: output ->
    (axis, start, stop) of each slice measured on its own (verify/slices.measure's)."""

    def __init__(self, reference: dict[str, np.ndarray], n: int, min_cosine: float, min_snr_db: float,
                 slices: dict[str, list[tuple[int, int, int]]] | None = None) -> None:
        import numpy as np

        self.min_cosine, self.min_snr_db = min_cosine, min_snr_db
        self.parts: dict[Part, list[np.ndarray]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for name, ref in reference.items():
            if ref.shape[0] % n == 0:  # one equal slice per sample, as the simulator returns them
                samples = np.split(ref, n)
                self.shapes[name] = samples[0].shape
                for part in [(name, -1, 0, 0), *((name, *sl) for sl in (slices or {}).get(name, []))]:
                    self.parts[part] = [_take(p, part).astype(np.float64).ravel() for p in samples]
        self.total = {part: sum(float(p @ p) for p in ps) for part, ps in self.parts.items()}
        self.proof: str | None = None
        self.bounds: list[dict[str, Any]] = []
        self.samples_run = n

    def best(self, part: Part, runs: list[dict[str, np.ndarray]]) -> tuple[float, float] | None:
        """The highest SNR and cosine `part` can still reach over all samples after `runs`; None for a zero
        reference (no bound claimed)."""
        name = part[0]
        if self.total[part] <= _ZERO_POWER:
            return None
        done = self.parts[part][:len(runs)]
        got = [_take(r[name].reshape(self.shapes[name]), part).ravel().astype("float64") for r in runs]
        err = sum(float((a - b) @ (a - b)) for a, b in zip(done, got))
        dot = sum(float(a @ b) for a, b in zip(done, got))
        g2 = sum(float(b @ b) for b in got)
        rest = self.total[part] - sum(float(a @ a) for a in done)
        snr_best = 10 * math.log10(self.total[part] / err) if err > _ZERO_POWER else math.inf
        cos_best = math.sqrt((max(dot, 0.0) ** 2 / g2 if g2 > _ZERO_POWER else 0.0) + max(rest, 0.0)) / math.sqrt(self.total[part])
        return snr_best, min(cos_best, 1.0)

    def __call__(self, runs: list[dict[str, np.ndarray]]) -> bool:
        """True once the samples run so far prove a failure (the reason is kept in `proof`, every part's bound
        in `bounds`)."""
        for part in self.parts:
            if (b := self.best(part, runs)) is None:
                continue
            snr_best, cos_best = b
            if snr_best < self.min_snr_db - _SNR_SLACK or cos_best < self.min_cosine - _COS_SLACK:
                self.samples_run = len(runs)
                self.proof = (f"after {len(runs)} sample(s) {_where(part)} can reach at most SNR {snr_best:.2f} dB, "
                              f"cosine {cos_best:.6f} over all samples")
                self.bounds = [_bound(p, x) for p in self.parts if (x := self.best(p, runs)) is not None]
                return True
        return False

    def record(self, n: int) -> dict[str, Any]:
        """The result's `early_stop`: the proof, and per output and slice the SNR the run could still have reached
        (an upper bound of its figure over all `n` samples: verify/predict.py carries HTP losses with it)."""
        return {"of": n, "proof": self.proof, "bounds": self.bounds}


def _where(part: Part) -> str:
    return f"output '{part[0]}'" + (f" slice {part[2]}:{part[3]}" if part[1] >= 0 else "")


def _bound(part: Part, best: tuple[float, float]) -> dict[str, Any]:
    """A part's bound, rounded up (it stays a bound); null when no error was seen yet (no bound)."""
    snr = math.ceil(best[0] * 1000) / 1000 if math.isfinite(best[0]) else None
    return {"output": part[0], **({"start": part[2], "stop": part[3]} if part[1] >= 0 else {}), "snr_db": snr}
