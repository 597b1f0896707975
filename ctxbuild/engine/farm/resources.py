"""What a task asks of a Dask worker: its toolchain, an HTP slot (kinds that use QNN), memory (memory.py's
measured factors)."""
from __future__ import annotations

import hashlib
from typing import Any

from ctxbuild.plan import kinds, memory
from ctxbuild.digests import canonical_json

TOOLCHAIN_PREFIX = "ctxbuild-toolchain-"
# Fingerprint resources only select workers; advertised in a quantity no build exhausts.
TOOLCHAIN_CAPACITY = 1e9


def toolchain_resource(fingerprint: dict[str, Any]) -> str:
    """The resource name a worker with exactly this toolchain fingerprint advertises."""
    return TOOLCHAIN_PREFIX + hashlib.sha256(canonical_json(fingerprint)).hexdigest()[:16]


def estimate_mem_gb(kind: str, input_bytes: int, params: dict[str, Any] | None = None) -> float:
    """Peak memory of one action in GB: memory.py's measured factors over the bytes it reads."""
    return round((memory.BASE + memory.factor(kind, params or {}) * input_bytes) / 2**30, 2)


def task_resources(kind: str, fingerprint: dict[str, Any], input_bytes: int,
                   cluster: dict[str, float], params: dict[str, Any] | None = None) -> dict[str, float]:
    """`cluster`: the most of each resource any one worker advertises. Only resources the cluster knows
    are asked for (a task asking for an unknown resource would wait forever); a memory estimate above
    the biggest worker is capped to it, so the action runs alone there rather than never."""
    wanted: dict[str, float] = {toolchain_resource(fingerprint): 1}
    if kinds.get(kind).uses_qnn and "qnn" in cluster:  # it loads the HTP backend: one of the worker's slots
        wanted["qnn"] = 1
    if "mem_gb" in cluster:
        wanted["mem_gb"] = min(estimate_mem_gb(kind, input_bytes, params), cluster["mem_gb"])
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
