"""What a task asks of a Dask worker: its toolchain, an HTP slot, memory. Small and replaceable on purpose
(the memory model is a first guess until real peaks are measured per model size)."""
from __future__ import annotations

import hashlib
from typing import Any

from ..action import canonical_json

# Kinds that load the QNN HTP backend (compile, simulate, wrap): they take a `qnn` slot where workers
# advertise one.
QNN_KINDS = frozenset({"compile", "bundle", "verify", "prebuilt"})
TOOLCHAIN_PREFIX = "ctxbuild-toolchain-"
# Fingerprint resources only select workers; advertised in a quantity no build exhausts.
TOOLCHAIN_CAPACITY = 1e9


def toolchain_resource(fingerprint: dict[str, Any]) -> str:
    """The resource name a worker with exactly this toolchain fingerprint advertises."""
    return TOOLCHAIN_PREFIX + hashlib.sha256(canonical_json(fingerprint)).hexdigest()[:16]


def estimate_mem_gb(kind: str, input_bytes: int) -> float:
    """Peak memory of one action: an HTP compile holds several copies of the graph's weights while it
    prepares them; others hold about one copy. A guess to be replaced by measured figures."""
    gb = input_bytes / 2**30
    return round(1.0 + (6.0 if kind in ("compile", "bundle") else 2.0) * gb, 2)


def task_resources(kind: str, fingerprint: dict[str, Any], input_bytes: int,
                   cluster: dict[str, float]) -> dict[str, float]:
    """`cluster`: the most of each resource any one worker advertises. Only resources the cluster knows
    are asked for (a task asking for an unknown resource would wait forever); a memory estimate above
    the biggest worker is capped to it, so the action runs alone there rather than never."""
    wanted: dict[str, float] = {toolchain_resource(fingerprint): 1}
    if kind in QNN_KINDS and "qnn" in cluster:
        wanted["qnn"] = 1
    if "mem_gb" in cluster:
        wanted["mem_gb"] = min(estimate_mem_gb(kind, input_bytes), cluster["mem_gb"])
    return wanted


def slots(workers: dict[str, dict[str, Any]]) -> int:
    """Actions the cluster runs at once: per worker its threads, or fewer `qnn` slots if it says so."""
    total = 0
    for w in workers.values():
        n = int(w.get("nthreads") or 1)
        qnn = (w.get("resources") or {}).get("qnn")
        total += min(n, int(qnn)) if qnn is not None else n
    return max(1, total)


def largest(workers: dict[str, dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for w in workers.values():
        for name, amount in (w.get("resources") or {}).items():
            out[name] = max(out.get(name, 0.0), float(amount))
    return out
