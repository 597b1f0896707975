"""Each part's calls while the float static graphs decode the verification prompts, recorded for the per-part checks
(actions/llm_part_eval.py): the inputs a part graph was fed and the float outputs it gave, so a part's compiled
graphs are checked on exactly what the float model feeds it, with no other part loaded and none re-run.

Which calls: per CL the first PREFILL_WINDOWS prefill windows (the largest AR; the first prompt's, so a prompt longer
than a window has its second window read the first one's cache) and per prompt and CL the first DECODE_STEPS token
steps (AR 1): every graph of a part gets calls, and the simulator runs a handful per graph instead of the whole decode,
however long the prompts.

What is kept, compactly: the past KV inputs up to the valid positions (the rest is zeros: pipeline.generate's cache
layout), the mask and position ids as the two numbers they are made from; of the outputs the valid rows (the new
positions' hidden states and KV), of the logits only the last valid row (the token step: its argmax is the float
model's token). One `.npz` per part, a JSON index in its `calls` entry.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.llm.pipeline import Runner, mask

PREFILL_WINDOWS = 2  # prefill windows recorded per CL
DECODE_STEPS = 2  # token steps recorded per prompt and CL


@dataclass
class Call:
    part: int
    ar: int
    cl: int
    past: int  # valid cache positions before the call
    valid: int  # real tokens in the call (a last prefill window is padded)
    inputs: dict[str, np.ndarray]  # as recorded (past KV cut to `past`)
    outputs: dict[str, np.ndarray]  # the float graph's: valid rows (logits: the last one)

    @classmethod
    def of(cls, part: int, ar: int, cl: int, feeds: dict[str, np.ndarray], got: dict[str, np.ndarray] | None = None
           ) -> "Call":
        """A call pipeline.generate made, compactly (its `got` outputs: the compared rows): the past KV up to the valid
        positions, the mask and position ids as the two numbers they are made from; feeds() gives the inputs back."""
        past = int(feeds["position_ids"][0, 0])
        valid = int((feeds["attention_mask"][0, 0, -1, cl - ar:] == 0).sum())
        inputs = {k: (v[:, :, :past].copy() if k.startswith("past_key_values.") else v)
                  for k, v in feeds.items() if k not in ("attention_mask", "position_ids")}
        return cls(part, ar, cl, past, valid, inputs, {k: compared(k, v, valid).copy() for k, v in (got or {}).items()})

    def feeds(self) -> dict[str, np.ndarray]:
        """The inputs as the graph takes them: past KV padded to CL - AR, the mask and position ids rebuilt."""
        f = {"attention_mask": mask(self.past, self.valid, self.ar, self.cl),
             "position_ids": (self.past + np.arange(self.ar, dtype=np.int64))[None]}
        for name, v in self.inputs.items():
            if name.startswith("past_key_values."):
                full = np.zeros((*v.shape[:2], self.cl - self.ar, v.shape[3]), v.dtype)
                full[:, :, :self.past] = v
                v = full
            f[name] = v
        return f


def compared(name: str, value: np.ndarray, valid: int) -> np.ndarray:
    """What of output `name` a check compares: the valid positions; of the logits the last valid one."""
    if name == "logits":
        return value[0, valid - 1]
    if name.startswith("present."):
        return value[0, :, :valid]
    return value[0, :valid]


class Recorder:
    """Keeps the selected calls of every part while the runners it hands out decode (a new one per prompt)."""

    def __init__(self, prefill_ar: int) -> None:
        self._prefill_ar = prefill_ar
        self.calls: list[Call] = []
        self._windows: dict[tuple[int, int], int] = {}  # (part, CL) -> prefill windows seen
        self._steps: dict[int, int] = {}  # part -> token steps seen in this prompt

    def runner(self, run: Runner) -> Runner:
        """`run`, recording: one per prompt (its token steps are counted from there)."""
        self._steps = {}
        return lambda part, ar, cl, feeds: self._record(run(part, ar, cl, feeds), part, ar, cl, feeds)

    def _record(self, got: dict[str, np.ndarray], part: int, ar: int, cl: int, feeds: dict[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
        if ar == self._prefill_ar:
            n = self._windows[(part, cl)] = self._windows.get((part, cl), 0) + 1
            keep = n <= PREFILL_WINDOWS
        else:
            n = self._steps[part] = self._steps.get(part, 0) + 1
            keep = n <= DECODE_STEPS
        if not keep:
            return got
        self.calls.append(Call.of(part, ar, cl, feeds, got))
        return got

    def write(self, part: int, path: Path) -> None:
        mine = [c for c in self.calls if c.part == part]
        arrays: dict[str, Any] = {}
        index = []
        for i, c in enumerate(mine):
            index.append({"ar": c.ar, "cl": c.cl, "past": c.past, "valid": c.valid})
            arrays.update({f"{i}/in/{k}": v for k, v in c.inputs.items()})
            arrays.update({f"{i}/out/{k}": v for k, v in c.outputs.items()})
        with open(path, "wb") as f:  # a file object: np.savez would append .npz to a path
            np.savez(f, calls=np.array(json.dumps({"part": part, "calls": index})), **arrays)


def read(path: Path) -> list[Call]:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["calls"]))
        calls = [Call(meta["part"], c["ar"], c["cl"], c["past"], c["valid"], {}, {}) for c in meta["calls"]]
        for key in z.files:
            if key == "calls":
                continue
            i, kind, name = key.split("/", 2)
            getattr(calls[int(i)], "inputs" if kind == "in" else "outputs")[name] = z[key]
    return calls
