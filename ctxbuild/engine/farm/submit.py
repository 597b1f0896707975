"""The action process's side of remote execution (runner.py calls it on a cache miss): upload the inputs'
blobs, ask the driver's gateway to run the action on the cluster, then restore its outputs from the cache
exactly like a hit (every blob's digest checked)."""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild import settings
from ctxbuild.errors import ActionError
from ctxbuild.engine.farm import wire



@dataclass
class FarmRun:
    record: Any  # the cache's ActionRecord of the restored outputs
    info: dict[str, Any]  # for the record: {"farm": {worker, host, seconds}} and the run's measurements


def run_on_farm(action: Action, key: str, components: dict[str, Any], discovered: dict[str, Path],
                cache: Any, out: Path) -> FarmRun | None:
    """None: no executor for this build, or the cluster is gone and the user asked for local fallback."""
    sock = settings.FARM.get()
    if not sock:
        return None
    if cache is None or cache.remote is None:  # the driver refuses this; a hand-run edge might not
        raise ActionError("remote execution needs a remote cache (the data plane)", "pass --remote-cache URL")
    files = sorted({**{action.inputs[r]: d for r, d in components["inputs"].items()},
                    **{str(discovered[n]): d for n, d in components["discovered_inputs"].items()}}.items())
    for path, digest in files:
        cache.remote.put_blob(digest, Path(path))  # HEAD first: present blobs (earlier outputs) are not re-sent
    reply = _ask(sock, {"action": action.to_spec(), "key": key, "fingerprint": components["toolchain"],
                        "files": files, "input_bytes": sum(os.stat(p).st_size for p, _ in files), "out": str(out)})
    if reply["status"] == "unavailable" and settings.EXECUTOR_FALLBACK.get() == "local":
        print(f"ctxbuild: warning: {reply['cause']}; running {action.id} locally (--executor-fallback local)",
              file=sys.stderr)
        return None
    if reply.get("log"):
        os.write(1, reply["log"].encode())  # the worker's log becomes this action's log (fd 1 is captured)
    where = f" on {reply['worker']}" if reply.get("worker") else ""
    if reply["status"] == "unavailable":
        raise ActionError(reply["cause"], "start it again and rebuild, or pass --executor-fallback local")
    if reply["status"] != "ok":
        raise ActionError(reply["cause"], f"ran{where}" if where else None, details=reply.get("details"))
    dest = {r: Path(p) for r, p in action.outputs.items()}
    hit = cache.lookup(key)
    if hit is None or not cache.restore(hit, dest):
        raise ActionError(f"{action.id} ran{where}, but its outputs could not be restored from the remote cache",
                          "; ".join(cache.warnings) or None)
    print(f"ran {action.id}{where} in {reply.get('seconds')} s; its log follows")
    sys.stdout.flush()
    os.write(1, cache.read_log(hit) or b"")
    return FarmRun(hit, {"farm": {k: reply[k] for k in ("worker", "host", "seconds") if k in reply},
                         **reply.get("facts", {})})


def _ask(path: str, request: dict[str, Any]) -> dict[str, Any]:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        wire.send(conn, request)
        reply = wire.recv(conn)
    except OSError as e:
        return {"status": "unavailable", "cause": f"the build's executor gateway is unreachable ({e})"}
    finally:
        conn.close()
    return reply or {"status": "unavailable", "cause": "the build's executor gateway went away"}
