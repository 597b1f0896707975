"""Memory-aware scheduling: each action's peak memory estimated from its kind and the size of the model
it reads, a budget the worker keeps concurrent actions within, and the peak RSS each action really had.

The factors are measured (bench/memory_bench.py, docs/large-models.md): peak RSS of one action process
= BASE + factor x the bytes of the model files it reads (.onnx plus external data). They err on the high
side; a build that knows better sets --memory-budget.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ctxbuild.plan import kinds
from ctxbuild import settings

# The forked action process before it reads any model (onnxruntime, the QNN EP, libQnnHtp.so mapped) is
# 100-170 MB; the fits below cross zero at 115-306 MB.
BASE = 300 << 20
# The per-kind factors (peak RSS per byte of the weights an action reads) live with each kind in plan/kinds/.


def estimate(action: Any, planned: Mapping[str, int] | None = None) -> int:
    """Bytes of peak RSS `action` is expected to need, from the sizes of the files it reads (`planned`: predicted
    sizes of files not written yet, by path: plan/planned_sizes.py)."""
    model = kinds.get(action.kind).memory

    def read(path: str | None, user_model: bool = False) -> int:
        return planned[path] if planned and path in planned else _size(path, user_model)

    paths = [path for role, path in action.inputs.items() if any(role.startswith(p) for p in model.weight_roles)]
    size = sum(read(path, model.user_model) for path in (set(paths) if model.files_once else paths))
    need = factor(action.kind, action.params) * size
    if model.per_context_length:
        need /= len(action.params["context_lengths"])
    if model.per_sequence_length:
        need /= len(action.params["graphs"]) // len(action.params["context_lengths"])
    if model.activations_per_position:
        need += model.activations_per_position * max(action.params["context_lengths"])
    if model.own_graph_factor:
        largest = max(sum(read(action.inputs.get(f"model:{g}{ext}")) for ext in ("", ".data"))
                      for g in action.params["graphs"])
        need = max(need, model.own_graph_factor * largest)
    return BASE + int(need)


def planned(actions: list[Any]) -> dict[str, int]:
    """Every action's estimate by id before any of them ran: the files earlier actions will write counted at
    their predicted sizes."""
    from ctxbuild.plan.planned_sizes import planned_sizes

    sizes = planned_sizes(actions)
    return {a.id: estimate(a, sizes) for a in actions}


def _size(path: str | None, with_external_data: bool = False) -> int:
    """A file's bytes (with the external data a user's model names); 0 for a missing input: the action reports it."""
    from ctxbuild.graph.modelio import weight_bytes

    try:
        return (weight_bytes(Path(path)) if with_external_data else Path(path).stat().st_size) if path else 0
    except OSError:
        return 0


def factor(kind: str, params: dict[str, Any]) -> float:
    """Peak RSS per byte of weights read, for an action of `kind` with `params` (the fits above)."""
    model = kinds.get(kind).memory
    if model.unoptimized_factor is not None and not params.get("optimize", True):
        return model.unoptimized_factor
    return model.by_precision.get(params.get("precision", ""), model.factor)


class Scheduler:
    """Memory tokens for the worker: start a request when its estimate fits in what running actions leave
    of the budget, else queue it (first come, first served: a big action is not starved by small ones).
    With nothing running, the head always starts: it fits alone or fails early (check_fits)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running: dict[int, int] = {}  # pid -> estimate
        self.queue: list[tuple[int, Any]] = []  # (estimate, request)

    def used(self) -> int:
        return sum(self.running.values())

    def submit(self, need: int, request: Any) -> list[tuple[int, Any]]:
        self.queue.append((need, request))
        return self.ready()

    def finished(self, pid: int) -> list[tuple[int, Any]]:
        self.running.pop(pid, None)
        return self.ready()

    def started(self, pid: int, need: int) -> None:
        self.running[pid] = need

    def ready(self) -> list[tuple[int, Any]]:
        """Requests to start now, in order; the caller reports each one's pid with started()."""
        out = []
        used = self.used()
        while self.queue and (not self.running and not out or used + self.queue[0][0] <= self.limit):
            need, req = self.queue.pop(0)
            used += need
            out.append((need, req))
        return out


def section(records: dict[str, Any], driver_peak: int | None) -> dict[str, Any]:
    """The report's memory table: the driver's peak and each action's estimate and peak of its last run."""
    rows = [{"id": i, "kind": r.get("kind"), "source": r.get("source"), "estimate": r.get("memory_estimate"),
             "peak_rss": r.get("peak_rss"), "seconds": r.get("seconds")}
            for i, r in sorted(records.items()) if r and r.get("peak_rss") is not None]
    return {"driver_peak_rss": driver_peak, "budget": settings.MEMORY_BUDGET.get(), "actions": rows}
