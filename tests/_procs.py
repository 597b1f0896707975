"""Processes a test started, found through /proc: what must be gone once a build has exited."""
from __future__ import annotations

import os
import time
from pathlib import Path


def live_processes(pred) -> list[int]:
    """Pids (not zombies) whose /proc entry satisfies pred(pid, stat_fields)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rpartition(")")[2].split()
            if fields[0] != "Z" and pred(int(d.name), fields):
                found.append(int(d.name))
        except (OSError, IndexError):
            continue
    return found


def in_group(pgid: int):
    return lambda pid, f: int(f[2]) == pgid


def with_cwd(path: Path):
    def pred(pid: int, f: list[str]) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/cwd") == str(path)
        except OSError:
            return False
    return pred


def wait_for(predicate, timeout: float, what: str, interval: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
