"""A fork server for actions: one pre-imported process forks a child per ninja edge.

Each edge still runs in its own process (a crash in the QNN library fails that edge alone), but the
child starts with onnx, onnxruntime, the quantizer and the registered QNN EP already loaded: ~10 ms
instead of ~0.25 s per action. ninja runs `python -S .../client.py SPEC`; the client sends
the spec, its environment and its stdout/stderr (ninja's pipe) over a unix socket and exits with the
child's status. Without a worker (e.g. plain `ninja` in OUT) the client runs the action itself.

The server is single-threaded (a selector over the listening socket, client connections and child
pidfds): forking from a multi-threaded process is unsafe.
"""
from __future__ import annotations

import marshal
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from . import memory
from .client import ENV
from .farm.wire import recv_exactly
from .procs import die_with_parent


# --- the driver side -------------------------------------------------------------------------------

@contextmanager
def running(log: Path) -> Iterator[dict[str, str]]:
    """Start a worker for the duration of a ninja run; yields the environment that points clients at it."""
    d = tempfile.mkdtemp(prefix="ctxbuild-w-")  # short path (AF_UNIX limit 108), private (0700)
    sock = os.path.join(d, "s")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "ctxbuild", "worker", sock], stdout=logf, stderr=logf,
                                stdin=subprocess.DEVNULL)
    try:
        yield {ENV: f"{sock}:{proc.pid}"}
    finally:
        _stop(proc)
        for p in (sock, d):
            try:
                os.unlink(p) if p == sock else os.rmdir(p)
            except OSError:
                pass


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then wait on a pidfd: Popen.wait(timeout=) polls with sleeps (~0.1 s lost per build)."""
    import select

    pidfd = os.pidfd_open(proc.pid)
    try:
        proc.terminate()
        if not select.select([pidfd], [], [], 10)[0]:
            proc.kill()
    finally:
        os.close(pidfd)
    proc.wait()


# --- the server -------------------------------------------------------------------------------------

def serve(sock_path: str) -> None:
    parent = _exit_with_parent()
    _preload()
    srv = _listen(sock_path)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, ("accept", None))
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    # SIGTERM must wake select() at once (PEP 475 would otherwise retry it until its timeout).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    sel.register(wake_r, selectors.EVENT_READ, ("wake", None))
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (client conn, pidfd)
    tokens = memory.Scheduler(memory.budget())  # requests wait here until their memory estimate fits

    def start(ready: list[tuple[int, tuple[socket.socket, list[int], dict]]]) -> None:
        """Fork the requests the memory budget lets run now; watch each child's exit and its client."""
        for need, (conn, fds, req) in ready:
            child = _spawn(conn, fds, req, srv)
            tokens.started(child, need)
            pidfd = os.pidfd_open(child)
            children[child] = (conn, pidfd)
            sel.register(pidfd, selectors.EVENT_READ, ("exit", child))
            sel.register(conn, selectors.EVENT_READ, ("client", child))

    while not stop or children:
        if os.getppid() != parent:  # the driver died without stopping us (and PDEATHSIG is unavailable)
            stop = True
        for key, _ in sel.select(timeout=5):
            kind, pid = key.data
            if kind == "wake":
                os.read(wake_r, 512)
            elif kind == "accept":
                conn, _ = srv.accept()
                request = _receive(conn)
                if request is None:
                    conn.close()
                    continue
                start(tokens.submit(_estimate(request[1]), (conn, *request)))
            elif kind == "exit":
                _reap(pid, sel, children)
                start(tokens.finished(pid))
            elif kind == "client" and pid in children:
                _check_client(pid, children)
        if stop and srv.fileno() != -1:  # stop accepting; the loop ends once running children are done
            sel.unregister(srv)
            srv.close()
            for path, remove in ((sock_path, os.unlink), (os.path.dirname(sock_path), os.rmdir)):
                try:  # the driver does this too, unless it was killed
                    remove(path)
                except OSError:
                    pass


def _preload() -> None:
    """Import once, before any fork: every action kind's implementation, the quantizer, the registered EP."""
    from . import cache, kinds, qnn_system, runner, toolchain  # noqa: F401
    import onnxruntime.quantization  # noqa: F401

    for kind in kinds.all_kinds():
        kind.module()
    toolchain.qnn_devices()
    # Map the HTP backend (106 MB, loaded by the EP at a session's start) once, here: each forked compile
    # then starts ~15 ms sooner, with byte-identical output (measured). Only this library: preloading
    # libHtpPrepare.so as well aborts on duplicate op registration.
    import ctypes

    ctypes.CDLL(str(toolchain.qnn_library_dir() / "libQnnHtp.so"))
    for dist in ("onnx", "onnxruntime", "onnxruntime-qnn"):  # memoized: children inherit the answers
        toolchain.version(dist)


def _listen(sock_path: str) -> socket.socket:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path + ".tmp")
    srv.listen(64)
    os.rename(sock_path + ".tmp", sock_path)  # clients see the socket only once it accepts
    return srv


def _reap(pid: int, sel: selectors.BaseSelector, children: dict[int, tuple[socket.socket, int]]) -> None:
    """The child exited: tell its client the exit code."""
    conn, pidfd = children.pop(pid)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        conn.sendall(struct.pack("!i", code))
    except OSError:
        pass
    for obj in (pidfd, conn):
        sel.unregister(obj)
    os.close(pidfd)
    conn.close()


def _check_client(pid: int, children: dict[int, tuple[socket.socket, int]]) -> None:
    """The client died (ninja interrupted, kill -9): its action must not run on unattended."""
    try:
        alive = children[pid][0].recv(1, socket.MSG_PEEK)
    except OSError:
        alive = b""
    if not alive:
        os.kill(pid, signal.SIGKILL)


def _exit_with_parent() -> int:
    """A driver killed with SIGKILL never runs its `finally`: have the kernel send us SIGTERM when it dies
    (the normal stop: finish running actions, then exit) instead of lingering forever. Returns the parent pid."""
    parent = os.getppid()
    die_with_parent(signal.SIGTERM)  # not inherited by the forked action processes
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
    return parent


def _receive(conn: socket.socket) -> tuple[list[int], dict] | None:
    """The client's stdout/stderr fds and its request (client.encode_request), or None if it hung up."""
    header, fds, _, _ = socket.recv_fds(conn, 4, 2)
    if len(header) < 4 or len(fds) != 2:
        return None
    body = recv_exactly(conn, struct.unpack("!I", header)[0])
    return None if body is None else (fds, marshal.loads(body))  # the socket is private (0700 dir)


def _estimate(req: dict) -> int:
    """The action's memory estimate (passed on to it in its environment, for its record and check)."""
    from .action import load_spec

    try:
        need = memory.estimate(load_spec(Path(req["cwd"]) / req["spec"]))
    except (OSError, ValueError, KeyError, TypeError):
        need = memory.BASE  # an unreadable spec: the action itself reports it
    req["env"][memory.ESTIMATE_ENV] = str(need)
    return need


def _spawn(conn: socket.socket, fds: list[int], req: dict, srv: socket.socket) -> int:
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    # The child: become the action process ninja thinks it started.
    try:
        srv.close()
        conn.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.close(fds[0])
        os.close(fds[1])
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        from .runner import main as run_action

        code = run_action(req["spec"])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except BaseException:  # noqa: BLE001 - a child must never return into the server loop
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
