"""How many simulator children a verification may run side by side: one per idle core, within memory.

The HTP simulator runs a sample on about one core (measured in docs/measured.md, "Verification cost": its
main thread does the work, its four HVX threads a few percent each), so a second core left idle by the
build -- the tail of a build, when ninja has nothing else to run -- can run other samples. Cores count as
busy when a runnable process is on them, whoever runs it (ninja's other actions, another build on a shared
machine): /proc/loadavg's runnable count, read a few times, the highest kept. Each extra child is counted at
the action's memory estimate, against both the memory available now and the build's budget.
"""
from __future__ import annotations

import os
import time

from ctxbuild.errors import ActionError
from ctxbuild import machine, settings

_READS, _READ_GAP_S = 5, 0.04
_HEADROOM = 256 << 20


def count(n_samples: int, need: int) -> int:
    """Children for `n_samples` samples of an action estimated at `need` bytes (plan/memory.estimate)."""
    try:
        forced = settings.VERIFY_WORKERS.get()  # a fixed count (1: always one child), instead of the idle cores
    except ValueError as e:
        raise ActionError(str(e)) from None
    if forced is not None:
        return max(1, min(forced, n_samples))
    # Cores no other process is on: this one's included, as it only waits while its children run.
    idle = len(os.sched_getaffinity(0)) - _others_runnable()
    room = min(machine.meminfo()["MemAvailable"] - _HEADROOM, machine.budget() - need)
    by_memory = room // need if need > 0 else n_samples
    return max(1, min(n_samples, idle, 1 + by_memory))


def _others_runnable() -> int:
    """Runnable processes besides this one, the highest of a few reads (a moment's count is noisy)."""
    seen = 0
    for i in range(_READS):
        if i:
            time.sleep(_READ_GAP_S)
        try:
            with open("/proc/loadavg") as f:
                seen = max(seen, int(f.read().split()[3].split("/")[0]) - 1)  # the count includes this reader
        except (OSError, IndexError, ValueError):
            return len(os.sched_getaffinity(0))  # unknown: assume busy, run one child
    return seen
