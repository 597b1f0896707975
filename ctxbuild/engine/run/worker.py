"""A fork server for actions: one pre-imported process forks a child per ninja edge.

Each edge still runs in its own process (a crash in the QNN library fails that edge alone), but the
child starts with onnx, onnxruntime, the quantizer and the registered QNN EP already loaded: ~10 ms
instead of ~0.25 s per action. ninja runs `python -S .../client.py SPEC`; the client sends
the spec, its environment and its stdout/stderr (ninja's pipe) over a unix socket and exits with the
child's status. Without a worker (e.g. plain `ninja` in OUT) the client runs the action itself.
The driver listens on the socket before ninja starts and the worker process behind it starts on demand
(`Worker`): a build that restores everything up front or has nothing to do never starts one.

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
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ctxbuild import machine, settings
from ctxbuild.plan import memory
from ctxbuild.engine.run.client import worker_env
from ctxbuild.engine.farm.wire import recv_exactly
from ctxbuild.procs import die_with_parent


# --- the driver side -------------------------------------------------------------------------------

class Worker:
    """A listening socket ninja's clients can use from the start, and the worker process behind it, started
    on demand: by the first client that connects, or by the driver once it knows actions will run. A build
    that runs no action (a no-op, everything restored up front) never pays the worker's ~0.5 s of imports."""

    def __init__(self, log: Path, toolchain: str | None = None) -> None:
        self.toolchain = toolchain  # a provisioned toolchain (its worker imports that onnxruntime and QNN)
        self._dir = tempfile.mkdtemp(prefix="ctxbuild-w-")  # short path (AF_UNIX limit 108), private (0700)
        self.path = os.path.join(self._dir, "s")
        self._log = log
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(self.path)
        self._srv.listen(64)  # clients queue here while the worker imports
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        self._watcher = threading.Thread(target=self._watch, name="ctxbuild-worker-watch", daemon=True)
        self._watcher.start()

    @property
    def env(self) -> dict[str, str]:
        return {worker_env(self.toolchain): self.path}

    @property
    def started(self) -> bool:
        return self._proc is not None

    @property
    def dead(self) -> bool:
        """Started and exited since (reaped here): the farm's Dask task starts another."""
        return self._proc is not None and self._proc.poll() is not None

    def start(self) -> None:
        """Have the worker started now (once), e.g. from the first cache miss before ninja runs. The watcher
        thread starts it: the worker's parent thread must live as long as the worker (PR_SET_PDEATHSIG)."""
        os.write(self._wake_w, b"s")

    def _spawn(self) -> None:
        with self._lock:
            if self._proc is not None or self._stopping:
                return
            self._log.parent.mkdir(parents=True, exist_ok=True)
            fd = self._srv.fileno()
            env = None
            if self.toolchain is not None:
                from ctxbuild.toolchain import choose, provision

                env = provision.env_for(choose.by_name(self.toolchain))
            with open(self._log, "wb") as logf:
                self._proc = subprocess.Popen([sys.executable, "-m", "ctxbuild", "worker", str(fd)], stdout=logf,
                                              stderr=logf, stdin=subprocess.DEVNULL, pass_fds=(fd,), env=env)

    def _watch(self) -> None:
        """Start the worker when asked to or when a client connects. If it dies while the build goes on,
        close the socket, so that clients fail at once instead of waiting for it. This thread lives until
        stop()."""
        import select

        while self._proc is None and not self._stopping:
            ready = select.select([self._srv, self._wake_r], [], [])[0]
            asked = self._wake_r in ready and b"s" in os.read(self._wake_r, 64)
            if (asked or self._srv in ready) and not self._stopping:
                self._spawn()
        pidfd = os.pidfd_open(self._proc.pid) if self._proc is not None else None
        try:
            while not self._stopping:
                ready = select.select([self._wake_r] + ([pidfd] if pidfd is not None else []), [], [])[0]
                if self._wake_r in ready:
                    os.read(self._wake_r, 64)
                elif pidfd in ready:
                    with self._lock:
                        if not self._stopping:
                            self._srv.close()
                    os.close(pidfd)
                    pidfd = None
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        os.write(self._wake_w, b"x")
        self._watcher.join()
        if self._proc is not None:
            _stop(self._proc)
        self._srv.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        for p in (self.path, self._dir):
            try:
                os.unlink(p) if p == self.path else os.rmdir(p)
            except OSError:
                pass


@contextmanager
def running(log: Path, toolchain: str | None = None) -> Iterator[Worker]:
    """A worker (started on demand) for the duration of a ninja run; `.env` points clients at it."""
    w = Worker(log, toolchain)
    try:
        yield w
    finally:
        w.stop()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then wait on a pidfd: Popen.wait(timeout=) polls with sleeps (~0.1 s lost per build)."""
    import select

    if proc.poll() is not None:  # exited already (and reaped: no pidfd to open)
        return
    pidfd = os.pidfd_open(proc.pid)
    try:
        proc.terminate()
        if not select.select([pidfd], [], [], 10)[0]:
            proc.kill()
    finally:
        os.close(pidfd)
    proc.wait()


# --- the server -------------------------------------------------------------------------------------

def serve(listen_fd: int) -> None:
    """Accept on the driver's listening socket (inherited as `listen_fd`) until SIGTERM. A Ctrl-C reaches the
    whole process group: the driver owns it and stops us with SIGTERM once ninja is done; actions keep
    Python's default (KeyboardInterrupt, then their cleanup)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = _exit_with_parent()
    _preload()
    srv = socket.socket(fileno=listen_fd)
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
    children: dict[int, tuple[socket.socket, int, dict]] = {}  # pid -> (client conn, pidfd, request)
    tokens = memory.Scheduler(machine.budget())  # requests wait here until their memory estimate fits

    def start(ready: list[tuple[int, tuple[socket.socket, list[int], dict]]]) -> None:
        """Fork the requests the memory budget lets run now; watch each child's exit and its client."""
        for need, (conn, fds, req) in ready:
            child = _spawn(conn, fds, req, srv)
            tokens.started(child, need)
            pidfd = os.pidfd_open(child)
            children[child] = (conn, pidfd, req)
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


def _preload() -> None:
    """Import once, before any fork: every action kind's implementation, the quantizer, the registered EP."""
    from ctxbuild import cache  # noqa: F401
    from ctxbuild.engine.run import runner  # noqa: F401
    from ctxbuild.plan import kinds
    from ctxbuild.qnn import system as qnn_system  # noqa: F401
    from ctxbuild.toolchain import installed as toolchain  # noqa: F401
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


def _reap(pid: int, sel: selectors.BaseSelector, children: dict[int, tuple[socket.socket, int, dict]]) -> None:
    """The child exited: tell its client the exit code. Killed by a signal (a crash in native code, the OOM
    killer) while its client still waits, it wrote no record: write the failed one for it, so the build names
    the action, the signal and its log instead of "ninja failed before running an action"."""
    conn, pidfd, req = children.pop(pid)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        conn.sendall(struct.pack("!i", code))
        if code < 0:
            from ctxbuild.engine.run.runner import record_crash

            record_crash(Path(req["cwd"]) / req["spec"], req["env"].get(settings.BUILD_ID.name), -code)
    except OSError:  # the client is gone (an interrupted build): its action was stopped on purpose
        pass
    for obj in (pidfd, conn):
        sel.unregister(obj)
    os.close(pidfd)
    conn.close()


def _check_client(pid: int, children: dict[int, tuple[socket.socket, int, dict]]) -> None:
    """The client died (ninja interrupted, kill -9): its action must not run on unattended."""
    try:
        alive = children[pid][0].recv(1, socket.MSG_PEEK)
    except OSError:
        alive = b""
    if not alive:
        _kill_tree(pid)


def _kill_tree(pid: int) -> None:
    """SIGKILL an action and every process under it. What it forked (an isolated compile, simulator runs) would
    otherwise finish its work first: seen running for seconds after an interrupted build had exited. Stopped
    first, so that it forks nothing new while its tree is read."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return
    for p in [*_descendants(pid), pid]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _descendants(pid: int) -> list[int]:
    """The processes under `pid` (children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    parent = int(f.read().rpartition(b")")[2].split()[1])
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


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
    from ctxbuild.plan.action import load_spec

    try:
        need = memory.estimate(load_spec(Path(req["cwd"]) / req["spec"]))
    except (OSError, ValueError, KeyError, TypeError):
        need = memory.BASE  # an unreadable spec: the action itself reports it
    req["env"][settings.MEMORY_ESTIMATE.name] = str(need)
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
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.close(fds[0])
        os.close(fds[1])
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        from ctxbuild.engine.run.runner import main as run_action

        code = run_action(req["spec"])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    except BaseException:  # noqa: BLE001 - a child must never return into the server loop
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
