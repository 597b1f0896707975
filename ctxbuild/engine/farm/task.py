"""What runs on a Dask worker: fetch an action's inputs from the remote cache by digest into a private
scratch dir, run the very same runner there (in a fresh process forked from a pre-imported ctxbuild
worker, as locally: the QNN EP's output depends on a fresh process), and publish outputs + record to the
remote cache. The reply is a small dict; every byte of data travels through the cache, none through Dask.

The FarmPlugin (registered by the driver's gateway) advertises the worker's toolchain fingerprints (the
installed toolchain's and each provisioned one's) as Dask resources, so the scheduler only places an action where the fingerprint in its key is the worker's
own; run_action checks it again and fails with both fingerprints named.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from distributed import WorkerPlugin, get_worker

from ctxbuild import settings
from ctxbuild.plan import actionkey, kinds
from ctxbuild.cache.backends import open_cache
from ctxbuild.engine.run.client import run_via_worker
from ctxbuild.errors import CacheError
from ctxbuild.layout import STATE, record_path, spec_name
from ctxbuild.atomic import read_json
from ctxbuild.engine.farm.resources import TOOLCHAIN_CAPACITY, toolchain_resource

PLUGIN_NAME = "ctxbuild-farm"
LOG_TAIL_BYTES = 64 << 10
# A record's fields the runner always writes; anything else is a measurement of the run (ctx.facts).
_RECORD_FIELDS = frozenset({"id", "kind", "recipes", "target", "build_id", "started", "key", "key_detail", "why",
                            "source", "cache_origin", "outputs", "status", "warnings", "cache_warnings", "seconds",
                            "finished", "log", "result", "graph_names", "cause"})
# Variables of the submitting side that must not reach the worker's runner (it would submit again).
_DROP_ENV = tuple(s.name for s in (settings.FARM, settings.EXECUTOR_FALLBACK, settings.NO_CACHE,
                                    settings.REMOTE_READ_ONLY, settings.WORKER))

_lock = threading.Lock()
_servers: dict[str | None, dict[str, Any]] = {}  # this worker process's fork servers, one per toolchain in use:
# {toolchain: {"worker": worker.Worker, "stack": ExitStack}}


def scratch_root(worker: Any) -> Path:
    return Path(worker.local_directory) / "ctxbuild"


def fingerprints(state: Path) -> dict[str, dict[str, Any]]:
    """The toolchain fingerprints action keys carry, without (prepare, quantize) and with QNN: the installed
    toolchain's, and each toolchain provisioned on this host (`ctxbuild toolchain provision` on the worker)."""
    from ctxbuild.toolchain import provision

    names = [None, *(r["name"] for r in provision.listing() if not r.get("unfinished"))]
    # one kind of each: the fingerprint depends on the kind only through uses_qnn
    reps = {flag: next(k.name for k in kinds.all_kinds() if k.uses_qnn is flag) for flag in (False, True)}
    return {f"{kind}@{name}" if name else kind: actionkey.fingerprint(kind, state, name)
            for name in names for kind in reps.values()}


def worker_fingerprints(dask_worker: Any) -> dict[str, dict[str, Any]]:
    """For `client.run`: what this worker advertises (error messages name it)."""
    return fingerprints(scratch_root(dask_worker))


class FarmPlugin(WorkerPlugin):
    async def setup(self, worker: Any) -> None:
        root = scratch_root(worker)
        root.mkdir(parents=True, exist_ok=True)
        _fork_server(root)
        fps = await asyncio.to_thread(fingerprints, root)
        await worker.set_resources(**{toolchain_resource(fp): TOOLCHAIN_CAPACITY for fp in fps.values()})

    # No teardown: the next build re-registers the plugin, and in-flight actions of another build still
    # use the fork server. It ends with the worker process (it follows its parent).


def _fork_server(root: Path, toolchain_name: str | None = None) -> str:
    """The socket of this Dask worker's fork server for a toolchain, started now if there is none or it died."""
    from ctxbuild.engine.run import worker as forkserver

    with _lock:
        server = _servers.setdefault(toolchain_name, {})
        w = server.get("worker")
        if w is not None and not w.dead:
            return w.path
        if w is not None:  # its socket is closed already (worker.Worker): clean up, start another
            server["stack"].close()
        stack = ExitStack()
        log = root / (f"forkserver-{toolchain_name}.log" if toolchain_name else "forkserver.log")
        w = stack.enter_context(forkserver.running(log, toolchain_name))
        w.start()  # import now, while the plugin sets up, not on the first action
        server.update(worker=w, stack=stack)
        return w.path


def run_action(req: dict[str, Any]) -> dict[str, Any]:
    """The Dask task. Never raises for the action's own failure: Dask would only retry it, and a failed
    action fails the same way everywhere. A dead worker is Dask's business (it reschedules, bounded)."""
    worker = get_worker()
    root = scratch_root(worker)
    started = time.monotonic()
    info = {"worker": worker.address, "host": socket.gethostname()}
    here = actionkey.fingerprint(req["action"]["kind"], root, req["action"].get("toolchain"))
    if here != req["fingerprint"]:
        return {**info, "status": "failed",
                "cause": f"toolchain mismatch: worker {worker.address} has {json.dumps(here, sort_keys=True)}, "
                         f"the action's key needs {json.dumps(req['fingerprint'], sort_keys=True)}"}
    task_dir = Path(tempfile.mkdtemp(prefix=f"{spec_name(req['action']['id'])[:-5]}.", dir=root))
    try:
        reply = _run_in(task_dir, req, root)
    except CacheError as e:  # the data plane failed, not the action
        reply = {"status": "error", "cause": f"on worker {worker.address}: {e}"}
    finally:
        shutil.rmtree(task_dir, ignore_errors=True)
    return {**info, **reply, "seconds": round(time.monotonic() - started, 3)}


def _run_in(task_dir: Path, req: dict[str, Any], root: Path) -> dict[str, Any]:
    store = req["store"]
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}  # the runner's, and this task's cache's
    env.update({settings.REMOTE_CACHE.name: store["url"], settings.REMOTE_TOKEN_ENV.name: store["token_env"],
                settings.REMOTE_TIMEOUT.name: str(store["timeout"]),
                settings.REMOTE_MAX_DOWNLOAD.name: str(store["max_download"]),
                settings.BUILD_ID.name: req.get("build_id") or ""})
    # This host's local cache in front of the remote: an input shared by several actions is fetched once. No
    # breaker shared with other tasks: each one tries the server again.
    cache = open_cache(env, shared_breaker=False)
    assert cache is not None and cache.local is not None  # CTXBUILD_NO_CACHE is not passed on
    if cache.remote is None:  # e.g. a proxy setting of this host's that the remote cache cannot go through
        return {"status": "error", "cause": "; ".join(cache.warnings)}
    local, remote = cache.local, cache.remote
    inputs = task_dir / "in"
    placed: dict[str, str] = {}
    for path, digest in req["files"]:
        dst = inputs / path.lstrip("/")  # mirrored: a model's external data and a _ctx.onnx's bin stay beside it
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not (local.fetch_into(digest, partial(remote.fetch_blob, digest)) and local.fetch_blob(digest, dst)):
            return {"status": "error", "cause": f"input {path} (sha256 {digest[:12]}) is not in the remote cache "
                                                f"{remote.url}"}
        placed[path] = str(dst)
    action = dict(req["action"])
    out, out_orig = task_dir / "out", Path(req["out"])
    action["inputs"] = {role: placed[p] for role, p in action["inputs"].items()}
    action["outputs"] = {role: str(out / _relative(Path(p), out_orig)) for role, p in action["outputs"].items()}
    action["watch"] = [str(inputs / w.lstrip("/")) for w in action["watch"]]
    for w in action["watch"]:
        Path(w).mkdir(parents=True, exist_ok=True)
    spec = out / STATE / "actions" / spec_name(action["id"])
    spec.parent.mkdir(parents=True)
    spec.write_text(json.dumps(action))
    with open(task_dir / "console.txt", "wb") as console:
        code = run_via_worker(str(spec), _fork_server(root, action.get("toolchain")),
                              fds=(console.fileno(), console.fileno()), env=env)
    record = read_json(record_path(out, action["id"]))

    def as_submitted(text: str) -> str:  # messages name the submitter's paths, not this scratch dir's
        return text.replace(str(inputs), "").replace(str(out), req["out"])

    if code is None or record is None:
        return {"status": "error", "cause": f"the action process on the worker did not finish (exit {code})",
                "log": as_submitted(_tail(task_dir / "console.txt"))}
    if record["status"] != "ok":
        return {"status": "failed", "cause": as_submitted(record.get("cause", "failed")),
                "details": record.get("result"), "log": as_submitted(_tail(out / record["log"]))}
    if record["key"] != req["key"]:  # same content, same toolchain: a path leaked into the key somewhere
        return {"status": "failed", "cause": f"the worker computed action key {record['key'][:16]}, the submitting "
                                             f"side {req['key'][:16]}: {json.dumps(record['key_detail'])[:500]}"}
    uploaded = record.get("source") == "run" and not record.get("cache_warnings")  # the runner stored it remotely
    if not uploaded and not cache.publish(record["key"]):
        return {"status": "error", "cause": "could not upload the outputs to the remote cache: "
                                            + ("; ".join(cache.warnings) or "unknown reason")}
    return {"status": "ok", "facts": {k: v for k, v in record.items() if k not in _RECORD_FIELDS}}


def _relative(p: Path, out: Path) -> Path:
    try:
        return p.relative_to(out)
    except ValueError:
        return Path(p.name)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""

