"""Child processes that must not outlive the driver (a `kill -9` of the driver never runs its cleanup), and
the driver's Ctrl-C, which must reach them."""
from __future__ import annotations

import signal

PR_SET_PDEATHSIG = 1
_interrupted = False


def note_interrupt() -> None:
    global _interrupted
    _interrupted = True


def interrupted() -> bool:
    return _interrupted


def check_interrupt() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C was seen. The handler's own KeyboardInterrupt can be lost: raised
    while the main thread forks, it lands in an at-fork hook (logging registers one), whose exceptions CPython
    only reports. Seen here: ninja then ran the whole build and the driver exited 0. Call after forking."""
    if _interrupted:
        raise KeyboardInterrupt


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies. Survives exec, not fork."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass  # not Linux: the worker's getppid() check still stops it
