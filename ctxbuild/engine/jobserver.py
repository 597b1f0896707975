"""Let ninja take its job slots from make's jobserver under `make -jN`.

ninja >= 1.13 is a jobserver client for the fifo protocol only (GNU make >= 4.4). GNU make 4.3 (Debian 12)
passes an anonymous pipe (`--jobserver-auth=R,W`); for that, ctxbuild relays tokens between make's pipe and
a private fifo it hands to ninja, keeping at most one idle token in the fifo so sibling make jobs are not
starved. The relay opens the pipe through /proc/self/fd to get its own non-blocking file description:
changing flags on make's shared description would break make.
"""
from __future__ import annotations

import fcntl
import os
import re
import tempfile
import termios
import threading
from array import array
from contextlib import contextmanager
from typing import Iterator

_AUTH = re.compile(r"--jobserver-(?:auth|fds)=(\S+)")


@contextmanager
def for_ninja(jobs: int | None) -> Iterator[tuple[int | None, dict[str, str]]]:
    """Yield (-j to pass to ninja or None, environment overrides)."""
    flags = os.environ.get("MAKEFLAGS", "")
    m = _AUTH.search(flags)
    if jobs is not None or m is None:
        yield jobs, {}
        return
    auth = m.group(1)
    if auth.startswith("fifo:"):
        yield None, {}  # ninja speaks this protocol itself
        return
    fds = _pipe_fds(auth)
    if fds is None:  # make did not pass the fds to us (recipe not marked `+`/`$(MAKE)`): be a normal build
        yield None, {}
        return
    with _Relay(*fds) as fifo:
        yield None, {"MAKEFLAGS": _AUTH.sub(f"--jobserver-auth=fifo:{fifo}", flags)}


def _pipe_fds(auth: str) -> tuple[int, int] | None:
    try:
        r, w = (int(x) for x in auth.split(","))
        os.fstat(r)
        os.fstat(w)
    except (ValueError, OSError):
        return None
    return r, w


class _Relay:
    def __init__(self, make_r: int, make_w: int) -> None:
        self._make_r = os.open(f"/proc/self/fd/{make_r}", os.O_RDONLY | os.O_NONBLOCK)
        self._make_w = os.open(f"/proc/self/fd/{make_w}", os.O_WRONLY | os.O_NONBLOCK)
        self._dir = tempfile.mkdtemp(prefix="ctxbuild-js-")
        self.path = os.path.join(self._dir, "fifo")
        os.mkfifo(self.path, 0o600)
        self._fifo = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)  # RDWR: never sees EOF
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="jobserver-relay", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        return self.path

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        # ninja has exited: every token it took is back in the fifo; return them all to make.
        while (tok := _read1(self._fifo)) is not None:
            os.write(self._make_w, tok)
        for fd in (self._fifo, self._make_r, self._make_w):
            os.close(fd)
        os.unlink(self.path)
        os.rmdir(self._dir)

    def _loop(self) -> None:
        while not self._stop.wait(0.01):
            idle = _available(self._fifo)
            if idle == 0:
                tok = _read1(self._make_r)
                if tok is not None:
                    os.write(self._fifo, tok)
            elif idle > 1:
                tok = _read1(self._fifo)
                if tok is not None:
                    os.write(self._make_w, tok)


def _available(fd: int) -> int:
    buf = array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return buf[0]


def _read1(fd: int) -> bytes | None:
    try:
        b = os.read(fd, 1)
    except BlockingIOError:
        return None
    return b or None
