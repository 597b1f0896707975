"""What a ninja edge runs: `python -S .../ctxbuild/client.py SPEC`.

It starts once per action, so its start-up is paid N times per build: it runs as a plain script without
`site` (-S) and imports only C modules (_socket, marshal, _struct; ~12 ms in all against ~28 ms for
`python -m` with the usual imports). It hands the action to the worker (worker.py); without one (plain
`ninja` in OUT) it re-executes itself as `python -m ctxbuild action SPEC` with site-packages, which runs
the action in-process.
"""
import _socket
import _struct
import marshal
import os
import sys
from array import array

ENV = "CTXBUILD_WORKER"  # settings.WORKER, spelled out: this script cannot import ctxbuild (see above)


def worker_env(toolchain: str | None) -> str:
    """The variable naming the socket of a toolchain's worker: CTXBUILD_WORKER_onnxruntime_qnn_2_3_0."""
    if toolchain is None:
        return ENV
    return ENV + "_" + "".join(c if c.isalnum() else "_" for c in toolchain)


def encode_request(spec: str, env: dict | None = None) -> bytes:
    """Length-prefixed marshal of {spec, cwd, env}; the worker decodes it (a private 0700 socket)."""
    body = marshal.dumps({"spec": os.path.abspath(spec), "cwd": os.getcwd(),
                          "env": dict(os.environ) if env is None else env})
    return _struct.pack("!I", len(body)) + body


def run_via_worker(spec: str, target: str | None = None, fds: tuple = (1, 2), env: dict | None = None,
                   toolchain: str | None = None) -> int | None:
    """Run the action in a child of the worker (of the action's toolchain); None if there is no usable worker
    (then run it here). The farm's Dask task (engine/farm/task.py) names its worker's socket, console file and
    environment; ninja's edges use the defaults."""
    path = target or os.environ.get(worker_env(toolchain))
    if not path:
        return None
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:  # the driver listens before ninja starts: a refused connection means no worker, not "not yet"
            conn.connect(path)
            # ninja's pipe (our stdout/stderr) goes to the action process: its output reaches ninja directly.
            conn.sendmsg([encode_request(spec, env)],
                         [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array("i", list(fds)).tobytes())])
        except OSError:  # nothing was sent: nothing ran
            return None
        data = b""
        while len(data) < 4:
            try:  # from here on the action may be running: never run it a second time
                chunk = conn.recv(4 - len(data))
            except OSError:
                chunk = b""
            if not chunk:
                print(f"error: {spec}: the ctxbuild worker went away", file=sys.stderr)
                return 1
            data += chunk
    finally:
        conn.close()
    status = _struct.unpack("!i", data)[0]
    if status < 0:
        print(f"error: {spec}: action process crashed (signal {-status}); see its log", file=sys.stderr)
        return 128 - status
    return status


def main(argv: list[str]) -> int:
    toolchain = None
    if argv and argv[0].startswith("--toolchain="):
        toolchain = argv.pop(0).partition("=")[2]
    if len(argv) != 1:
        print("usage: client.py [--toolchain=NAME] SPEC", file=sys.stderr)
        return 2
    code = run_via_worker(argv[0], toolchain=toolchain)
    if code is not None:
        return code
    # Without a worker the action runs here, and the runner moves into the spec's toolchain itself.
    if __package__:  # imported (`ctxbuild action`): site-packages are there, run the action here
        from ctxbuild.engine.run.runner import main as run_action

        return run_action(argv[0])
    os.execv(sys.executable, [sys.executable, "-m", "ctxbuild", "action", argv[0]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
