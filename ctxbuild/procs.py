"""Child processes that must not outlive the driver (a `kill -9` of the driver never runs its cleanup), and
the driver's Ctrl-C, which must reach them."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PR_SET_PDEATHSIG = 1
_interrupted = False
_by = signal.SIGINT  # the signal that interrupted: Ctrl-C, or SIGTERM (a CI job cancelled, `kill`)


def note_interrupt(signum: int = signal.SIGINT) -> None:
    global _interrupted, _by
    if not _interrupted:
        _by = signal.Signals(signum)
    _interrupted = True


def interrupted() -> bool:
    return _interrupted


def interrupted_by() -> signal.Signals:
    return _by


def check_interrupt() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C was seen. The handler's own KeyboardInterrupt can be lost: raised
    while the main thread forks, it lands in an at-fork hook (logging registers one), whose exceptions CPython
    only reports. Seen here: ninja then ran the whole build and the driver exited 0. Call after forking."""
    if _interrupted:
        raise KeyboardInterrupt


def run_interruptible(cmd: list[str], *, on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
                      **popen: Any) -> int:
    """Run `cmd` (ninja) to its end; a Ctrl-C is passed on to it, then raised here as KeyboardInterrupt once it
    has stopped. While it runs, SIGINT only sets the flag: raised from the handler, KeyboardInterrupt landed in
    whatever Python code ran next (seen: a weakref callback, which drops it with a traceback), and a SIGINT
    the kernel gave another thread left the main thread in waitpid until ninja had built everything; one
    that reached the child before its exec was lost to it. The flag is checked whenever ninja exits, the
    signal's wakeup fd fires, or every second. `on_start`: called with the process (e.g. to read its pipe)."""
    with _sigint_noted() as wake, subprocess.Popen(cmd, **popen) as p:
        if on_start is not None:
            on_start(p)
        pidfd = os.pidfd_open(p.pid)
        try:
            forwarded = False
            while True:
                if _interrupted and not forwarded:
                    p.send_signal(signal.SIGINT)  # ninja stops its running edges, as on a terminal's Ctrl-C
                    forwarded = True
                ready = select.select([pidfd] + ([wake] if wake is not None else []), [], [], 1.0)[0]
                if wake is not None and wake in ready:
                    os.read(wake, 512)
                if pidfd in ready:
                    code = p.wait()
                    check_interrupt()
                    return code
        except BaseException:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
        finally:
            os.close(pidfd)


@contextmanager
def _sigint_noted() -> Iterator[int | None]:
    """SIGINT or SIGTERM sets the flag and wakes the returned fd (None, and no change, off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    old_fd = signal.set_wakeup_fd(w)
    old = {s: signal.signal(s, lambda signum, frame: note_interrupt(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield r
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(old_fd)
        os.close(r)
        os.close(w)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies. Survives exec, not fork."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass  # not Linux: the worker's getppid() check still stops it
