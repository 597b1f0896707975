"""Child processes that must not outlive the driver (a `kill -9` of the driver never runs its cleanup)."""
from __future__ import annotations

import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies. Survives exec, not fork."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass  # not Linux: the worker's getppid() check still stops it
