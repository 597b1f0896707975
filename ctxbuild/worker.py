"""A fork server for actions: one pre-imported process forks a child per ninja edge.

Each edge still runs in its own process (a crash in the QNN library fails that edge alone), but the
child starts with onnx, onnxruntime, the quantizer and the registered QNN EP already loaded: ~10 ms
instead of ~0.25 s per action. ninja runs `python -m ctxbuild action SPEC` as usual; that client sends
the spec, its environment and its stdout/stderr (ninja's pipe) over a unix socket and exits with the
child's status. Without a worker (e.g. plain `ninja` in OUT) the client runs the action itself.

The server is single-threaded (a selector over the listening socket, client connections and child
pidfds): forking from a multi-threaded process is unsafe.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ENV = "CTXBUILD_WORKER"
_CONNECT_WAIT_S = 30.0  # the worker imports for ~0.5 s after the driver starts it; first clients wait


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
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for p in (sock, d):
            try:
                os.unlink(p) if p == sock else os.rmdir(p)
            except OSError:
                pass


# --- the client side (what a ninja edge runs) -------------------------------------------------------

def run_via_worker(spec: str) -> int | None:
    """Run the action in a child of the worker; None if there is no usable worker (caller runs it in-process)."""
    target = os.environ.get(ENV)
    if not target:
        return None
    sock_path, _, pid = target.rpartition(":")
    conn = _connect(sock_path, int(pid))
    if conn is None:
        return None
    with conn:
        msg = json.dumps({"spec": os.path.abspath(spec), "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(msg)) + msg], [1, 2])
        data = b""
        while len(data) < 4:
            chunk = conn.recv(4 - len(data))
            if not chunk:
                print(f"error: {spec}: the ctxbuild worker went away", file=sys.stderr)
                return 1
            data += chunk
    status = struct.unpack("!i", data)[0]
    if status < 0:
        print(f"error: {spec}: action process crashed (signal {-status}); see its log", file=sys.stderr)
        return 128 - status
    return status


def _connect(path: str, pid: int) -> socket.socket | None:
    deadline = time.monotonic() + _CONNECT_WAIT_S
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
        if time.monotonic() > deadline or not _alive(pid):
            return None
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


# --- the server -------------------------------------------------------------------------------------

def serve(sock_path: str) -> None:
    from . import runner, toolchain  # noqa: F401 - the point: import once, before any fork
    import onnxruntime.quantization  # noqa: F401

    toolchain.qnn_devices()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path + ".tmp")
    srv.listen(64)
    os.rename(sock_path + ".tmp", sock_path)  # clients see the socket only once it accepts
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, ("accept", None))
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (client conn, pidfd)
    while not stop or children:
        for key, _ in sel.select(timeout=0.5):
            kind, pid = key.data
            if kind == "accept":
                conn, _ = srv.accept()
                child = _spawn(conn, srv)
                if child is None:
                    conn.close()
                    continue
                pidfd = os.pidfd_open(child)
                children[child] = (conn, pidfd)
                sel.register(pidfd, selectors.EVENT_READ, ("exit", child))
                sel.register(conn, selectors.EVENT_READ, ("client", child))
            elif kind == "exit":
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
            elif kind == "client" and pid in children:
                # The client died (ninja interrupted, kill -9): its action must not run on unattended.
                try:
                    alive = children[pid][0].recv(1, socket.MSG_PEEK)
                except OSError:
                    alive = b""
                if not alive:
                    os.kill(pid, signal.SIGKILL)
        if stop:
            sel.unregister(srv)
            srv.close()
            stop = False if children else stop
            if not children:
                break


def _spawn(conn: socket.socket, srv: socket.socket) -> int | None:
    header, fds, _, _ = socket.recv_fds(conn, 4, 2)
    if len(header) < 4 or len(fds) != 2:
        return None
    size = struct.unpack("!I", header)[0]
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    req = json.loads(body)
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
