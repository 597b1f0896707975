"""This machine's memory: what it has, the budget a build keeps its actions within, and peak RSS.

Read by the planner's estimates (plan/memory.py), the worker's scheduler and the verifier's sample workers."""
from __future__ import annotations

import os
import resource
from pathlib import Path

from ctxbuild import settings
from ctxbuild.errors import ActionError

GiB = 1 << 30


def meminfo() -> dict[str, int]:
    """MemTotal and MemAvailable in bytes (Linux)."""
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, value = line.split(":", 1)
                if name in ("MemTotal", "MemAvailable"):
                    out[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    if "MemTotal" not in out:
        out["MemTotal"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    out.setdefault("MemAvailable", out["MemTotal"])
    return out


def default_budget() -> int:
    """What the build may use at once: the memory available when it starts, less room for the driver."""
    return max(meminfo()["MemAvailable"] - (256 << 20), 512 << 20)


def budget() -> int:
    """The budget the driver chose (environment), else the default measured now."""
    chosen = settings.MEMORY_BUDGET.get()
    return default_budget() if chosen is None else chosen


def check_fits(need: int) -> None:
    """An action that would not fit even alone fails before it starts, not by the OOM killer's hand."""
    limit = budget()
    if need > limit:
        info = meminfo()
        raise ActionError(
            f"needs an estimated {fmt(need)} of memory; the budget is {fmt(limit)} "
            f"(this machine: {fmt(info['MemTotal'])} RAM, {fmt(info['MemAvailable'])} available now)",
            "free memory, use a machine with more RAM, or raise --memory-budget if the estimate is too high")


def peak_rss(*, children: bool = True) -> int:
    """Peak resident set of this process and (`children`) of its waited-for children, e.g. the simulator's."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if children:
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return peak * 1024  # Linux reports KiB


def proportional_set_size() -> int | None:
    """This process's PSS in bytes: each resident page once, shared ones divided among their mappings (a file two
    sessions map counts once, where RSS counts it twice); None where /proc/self/smaps_rollup is missing."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Pss:")), None)


def fmt(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / (1 << 20):.0f} MiB"
