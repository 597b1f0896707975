"""A CPU runner over one context length's float graphs that keeps only one AR's sessions open.

Every session of a part holds the part's weights (its graphs share one file on disk, not in memory), so the
AR 128 and AR 1 sessions of every part together hold the model twice: 26 GB for the 3B shape's 12.8 GB of float32
weights, more than a 24 GB machine has. A greedy decode runs the prompt chunks at the largest AR, then every token
at AR 1 (llm/pipeline.generate), so closing the other AR's sessions costs one reopening per prompt and switch,
and the weights are held once.
"""
from __future__ import annotations

import gc
from pathlib import Path

import numpy as np

from ctxbuild.llm.pipeline import Bound, Runner, cpu_runner


def one_ar_runner(models: dict[tuple[int, int, int], Path], bound: Bound | None = None,
                  config: dict[str, str] | None = None) -> Runner:
    """pipeline.cpu_runner over `models` [(part, ar, cl)] (with its `bound` and `config`), with the sessions of one
    AR open at a time."""
    current: dict[str, object] = {"ar": None, "run": None}

    def run(part: int, ar: int, cl: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if current["ar"] != ar:
            current["run"] = None  # the other AR's sessions close before this one's open
            gc.collect()
            current["ar"] = ar
            current["run"] = cpu_runner({k: v for k, v in models.items() if k[1] == ar}, bound, config)
        return current["run"](part, ar, cl, feeds)  # type: ignore[operator]

    return run
