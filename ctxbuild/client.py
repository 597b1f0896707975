"""What a ninja edge runs: `python -m ctxbuild.client SPEC`. Kept to the standard library's lightest
modules: it starts once per action, so every import here is paid N times per build."""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time

ENV = "CTXBUILD_WORKER"
_CONNECT_WAIT_S = 30.0  # the worker imports for ~0.5 s after the driver starts it; first clients wait


def run_via_worker(spec: str) -> int | None:
    """Run the action in a child of the worker; None if there is no usable worker (run it in-process)."""
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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ctxbuild.client SPEC", file=sys.stderr)
        return 2
    code = run_via_worker(argv[0])
    if code is None:  # no worker (e.g. plain `ninja` in OUT): run the action here
        from .runner import main as run_action

        code = run_action(argv[0])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
