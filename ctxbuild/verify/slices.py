"""Per-slice verification metrics for outputs whose parts live on different scales.

A YOLO-style head concatenates boxes (0-320) and class scores (0-1) into one output: the whole output's
SNR is dominated by the boxes and reads fine while the scores are noise. Verification therefore also
measures each slice along the Concat axis when the slices' ranges differ by RANGE_RATIO or more (found in
the float model: a Concat making a graph output), or always for slices the recipe declares
(`verify.slices: {output: {axis, sizes}}`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ctxbuild.qnn.split_outputs import concat_outputs

if TYPE_CHECKING:  # imported where arrays are made: a cache hit needs no numpy
    import numpy as np

RANGE_RATIO = 10.0  # one order of magnitude between the largest and smallest slice's max |value|


@dataclass(frozen=True)
class Slices:
    axis: int
    sizes: tuple[int, ...]
    labels: tuple[str, ...]
    declared: bool  # from the recipe: always reported


def find(model: Any, declared: dict[str, dict[str, Any]] | None) -> dict[str, Slices]:
    """Slices per output: the recipe's, else those of a final Concat whose part sizes are known."""
    out: dict[str, Slices] = {}
    for name, spec in (declared or {}).items():
        sizes = tuple(spec["sizes"])
        out[name] = Slices(spec.get("axis", 1), sizes, tuple(_range_label(sizes, i) for i in range(len(sizes))), True)
    for name, j in concat_outputs(model).items():
        if name not in out and all(j.sizes):
            out[name] = Slices(j.axis, j.sizes, j.parts, False)
    return out


def _range_label(sizes: tuple[int, ...], i: int) -> str:
    start = sum(sizes[:i])
    return f"{start}:{start + sizes[i]}"


def bounds(ref: np.ndarray, s: Slices) -> list[tuple[str, int, int, int, float]] | None:
    """(label, start, stop, axis, range) per slice `measure` reports, or None when the slices' ranges are alike
    (and the recipe did not ask). Known from the reference alone: before the simulator runs."""
    import numpy as np

    axis = s.axis if s.axis >= 0 else s.axis + ref.ndim
    if not 0 <= axis < ref.ndim or sum(s.sizes) != ref.shape[axis]:
        return None
    cuts = np.cumsum((0,) + s.sizes)
    ranges = [float(np.abs(np.take(ref, range(a, b), axis=axis)).max()) if b > a else 0.0
              for a, b in zip(cuts[:-1], cuts[1:])]
    if not s.declared and (min(ranges) <= 0 or max(ranges) / min(ranges) < RANGE_RATIO):
        return None
    return [(label, int(a), int(b), axis, rng) for label, a, b, rng in zip(s.labels, cuts[:-1], cuts[1:], ranges)]


def measure(ref: np.ndarray, got: np.ndarray, s: Slices,
            metrics: Callable[[np.ndarray, np.ndarray], dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Metrics per slice, or None when the slices' ranges are alike (and the recipe did not ask)."""
    import numpy as np

    got = got.reshape(ref.shape)
    found = bounds(ref, s)
    if found is None:
        return None
    return [{"slice": label, "start": a, "stop": b, "axis": axis, "range": rng,
             **metrics(np.take(ref, range(a, b), axis=axis), np.take(got, range(a, b), axis=axis))}
            for label, a, b, axis, rng in found]


def annotate(outputs: dict[str, dict[str, Any]], model: Any, declared: dict[str, dict[str, Any]] | None,
             reference: dict[str, np.ndarray], got: dict[str, np.ndarray],
             metrics: Callable[[np.ndarray, np.ndarray], dict[str, Any]]) -> None:
    """Adds `slices` (measure's list) to the figures of each output of `model` that has them."""
    for name, s in find(model, declared).items():
        if name in reference and (per_slice := measure(reference[name], got[name], s, metrics)):
            outputs[name]["slices"] = per_slice


def stop_parts(model: Any, declared: dict[str, dict[str, Any]] | None,
               reference: dict[str, np.ndarray]) -> dict[str, list[tuple[int, int, int]]]:
    """output -> (axis, start, stop) of each slice that will be measured: what an early stop must bound too."""
    found = {name: bounds(reference[name], s) for name, s in find(model, declared).items() if name in reference}
    return {name: [(axis, a, b) for _, a, b, axis, _ in parts] for name, parts in found.items() if parts}
