"""The precision search's gate files: `{"run": true}` or `{"run": false}`; the mixed rung's gate (written by
its `culprits` action) also holds the settings its quantize uses, and the figures behind them.

A `search_step` action writes one per candidate (per target, or for the candidate's shared quantize and CPU
screen); the candidate's heavy actions (quantize, screen, compile, verify) take it as their `gate` input.
Its two possible contents are part of their action keys like any input's: a candidate that runs is keyed as
it always is plus `run`, one the search no longer needs gets a different key and only writes placeholders
(cached too: a few bytes). Because the file holds the decision and not the figures behind it, a threshold
change that leaves a candidate's decision alone leaves its key alone: nothing recompiles.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROLE = "gate"
SKIPPED = {"skipped": True}


def content(run: bool) -> str:
    return json.dumps({"run": run}, sort_keys=True)


def closed(inputs: dict[str, str]) -> bool:
    """True when the action's gate says the search does not need it (no gate: it runs)."""
    if ROLE not in inputs:
        return False
    return not json.loads(Path(inputs[ROLE]).read_text())["run"]


def decided_settings(inputs: dict[str, str]) -> dict[str, Any] | None:
    """The quantization settings a mixed rung's gate holds (None: not a mixed rung's gate)."""
    if ROLE not in inputs:
        return None
    return json.loads(Path(inputs[ROLE]).read_text()).get("quantization")


def write_skipped(ctx: Any) -> None:
    """Placeholders for every output of a gated-off action: JSON outputs say `skipped`, the rest are empty
    (model and binary files nothing reads: every consumer is gated by the same decision or reads the gate)."""
    for role, path in ctx.action.outputs.items():
        tmp = ctx.tmp_output(role)
        tmp.write_text(json.dumps(SKIPPED) if path.endswith(".json") else "")
    print(f"{ctx.action.id}: not needed by the precision search (an earlier candidate decided it)")


def is_skipped(result: dict[str, Any] | None) -> bool:
    return bool(result and result.get("skipped"))
