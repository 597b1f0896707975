"""The driver's side of remote execution: one dask Client for the whole build, and a unix socket on which
the build's action processes ask it to run their actions (a Client per action would cost a connection
handshake and ~1 s of imports each). Each request becomes one Dask future; a request whose action
process goes away (ninja interrupted) cancels its future, and leaving the build cancels them all."""
from __future__ import annotations

import logging
import os
import select
import shutil
import socket
import socketserver
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ctxbuild.errors import cause_line, ExecutorUnavailable, UsageError
from ctxbuild import settings
from ctxbuild.cache.backends import open_remote
from ctxbuild.engine.farm import resources, wire

CONNECT_TIMEOUT_S = 5.0
WORKERS_TIMEOUT_S = 30.0
# A scheduler connection that stays down this long fails the actions waiting on it.
RECONNECT_GRACE_S = 10.0
_POLL_S = 0.2
WORKERS_TTL_S = 2.0
SCHEMES = ("tcp", "tls", "ucx", "inproc", "ws", "wss")  # Dask's comm backends


@dataclass
class Farm:
    env: dict[str, str]  # for ninja's environment: points action processes at the gateway
    slots: int  # actions the cluster runs at once: ninja's -j


def check_data_plane(env: dict[str, str]) -> dict[str, Any]:
    """A remote executor moves every byte through the remote cache: it must be there and writable."""
    url = settings.REMOTE_CACHE.get(env)
    if not url or settings.NO_CACHE.get(env) or settings.REMOTE_READ_ONLY.get(env):
        raise UsageError("--executor needs a writable remote cache: it is how inputs and outputs travel",
                         "add --remote-cache URL (or cache.remote in _defaults.yaml), without --no-cache "
                         "or --remote-read-only")
    # Without user:password: the request travels through Dask; each worker reads its own ~/.netrc or token.
    return {"url": open_remote(url).url, "token_env": settings.REMOTE_TOKEN_ENV.get(env),
            "timeout": settings.REMOTE_TIMEOUT.get(env), "max_download": settings.REMOTE_MAX_DOWNLOAD.get(env)}


def check_address(address: str) -> None:
    """A scheme Dask cannot speak is a usage error, before connecting: dask's Client would raise it only
    after its own 10 s close timeout, with a traceback (the recipe schema holds `executor:` to these too)."""
    scheme = address.partition("://")[0] if "://" in address else "tcp"  # dask's default for host:port
    if scheme not in SCHEMES:
        raise UsageError(f"--executor {address!r}: scheme {scheme!r} is not a Dask scheduler's",
                         f"use {'://, '.join(SCHEMES)}://HOST:PORT, e.g. tcp://scheduler:8786, or local")


@contextmanager
def running(address: str, *, store: dict[str, Any], build_id: str, fallback: str | None) -> Iterator[Farm | None]:
    """Connect to the scheduler for the build; None when it is unreachable and fallback is "local"."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--executor needs dask and distributed", "pip install 'ctxbuild[farm]'") from None
    from ctxbuild.engine.farm.task import PLUGIN_NAME, FarmPlugin

    # Dask logs connection trouble with tracebacks on stderr; the build reports it in one line per action.
    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name.startswith("distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    try:
        _probe(address)
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        reason = f"the Dask scheduler at {address} is unreachable ({cause_line(e, limit=200)})"
        if fallback == "local":
            print(f"ctxbuild: warning: {reason}; building locally (--executor-fallback local)", file=sys.stderr)
            yield None
            return
        raise ExecutorUnavailable(reason, "start it (`dask scheduler`), check the address, or pass "
                                          "--executor-fallback local") from None
    gateway = None
    try:
        try:
            client.wait_for_workers(1, timeout=WORKERS_TIMEOUT_S)
        except TimeoutError:
            raise ExecutorUnavailable(f"the Dask scheduler at {address} has no workers",
                                      "start some: dask worker " + address) from None
        try:
            client.register_plugin(FarmPlugin(), name=PLUGIN_NAME)  # on every worker, present and future
        except (OSError, TimeoutError) as e:  # dask's CommClosedError is an OSError: a worker out of reach
            raise ExecutorUnavailable(f"a Dask worker of {address} could not be reached to set up ctxbuild on it: "
                                      f"{type(e).__name__}: {str(e)[:200]}",
                                      "check the workers' network, or stop the unreachable worker") from None
        except Exception as e:  # noqa: BLE001 - e.g. a worker without ctxbuild cannot unpickle the plugin
            raise ExecutorUnavailable(f"could not set up ctxbuild on the Dask workers of {address}: "
                                      f"{type(e).__name__}: {str(e)[:200]}",
                                      "install ctxbuild[farm] (same version) on every worker") from None
        gateway = _Gateway(client, address, store, build_id)
        yield Farm({settings.FARM.name: gateway.path, **({settings.EXECUTOR_FALLBACK.name: fallback} if fallback else {})},
                   resources.slots(gateway.workers()))
    finally:
        if gateway is not None:
            gateway.close()
            if gateway.gone and fallback == "local":  # each action's log says so too; the user sees it once
                print(f"ctxbuild: warning: the Dask scheduler at {address} went away during the build; the "
                      "actions after that ran locally (--executor-fallback local)", file=sys.stderr)
        client.close()


class _Gateway:
    def __init__(self, client: Any, address: str, store: dict[str, Any], build_id: str) -> None:
        self.client, self.address, self.store, self.build_id = client, address, store, build_id
        self._futures: set[Any] = set()
        self._workers: tuple[float, dict[str, dict[str, Any]]] | None = None
        self.gone = False  # the scheduler went away: later actions are told at once
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="ctxbuild-g-")  # private (0700), short (AF_UNIX path limit)
        self.path = os.path.join(self._dir, "s")
        gateway = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    req = wire.recv(self.request)
                    reply = gateway.run(req, self.request) if req is not None else None
                    if reply is not None:
                        wire.send(self.request, reply)
                except OSError:  # the action process went away (ninja interrupted): nobody to answer
                    pass

        self._server = socketserver.ThreadingUnixStreamServer(self.path, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="ctxbuild-gateway", daemon=True)
        self._thread.start()

    def workers(self, fresh: bool = True) -> dict[str, dict[str, Any]]:
        """The scheduler's view of the workers; `fresh=False` reuses one up to WORKERS_TTL_S old (one round
        trip to the scheduler fewer per action)."""
        with self._lock:
            if fresh or self._workers is None or time.monotonic() - self._workers[0] > WORKERS_TTL_S:
                self._workers = (time.monotonic(), self.client.scheduler_info(n_workers=-1)["workers"])
            return self._workers[1]

    def run(self, req: dict[str, Any], conn: socket.socket) -> dict[str, Any] | None:
        """Submit one action and wait for it; None if the asking process hung up (its future is cancelled)."""
        from distributed import KilledWorker

        from ctxbuild.engine.farm.task import run_action

        action = req["action"]
        wanted = resources.toolchain_resource(req["fingerprint"])
        if self.gone or self.client.status != "running":  # no waiting out a reconnect per action
            return self._went_away()
        try:
            workers = self.workers(fresh=False)
            if not _offered(wanted, workers):  # a worker may have joined since
                workers = self.workers()
        except Exception:  # noqa: BLE001 - the scheduler went away between two actions
            return self._went_away()
        if not _offered(wanted, workers):
            return {"status": "failed", "cause": self._no_toolchain(req["fingerprint"])}
        task = {**req, "store": self.store, "build_id": self.build_id}
        future = self.client.submit(
            run_action, task, key=f"ctxbuild-{action['id']}-{uuid.uuid4().hex[:8]}", pure=False, retries=0,
            resources=resources.task_resources(action["kind"], req["fingerprint"], req["input_bytes"],
                                               resources.largest(workers), action.get("params")))
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())  # waiting on it costs no round trip to the client loop
        with self._lock:
            self._futures.add(future)
        down_since = None
        try:
            while True:
                try:
                    if done.wait(_POLL_S):
                        return future.result()
                except KilledWorker:
                    return {"status": "failed", "cause": f"Dask workers died each time they ran {action['id']}; "
                            "not retrying it again (distributed.scheduler.allowed-failures)"}
                except Exception as e:  # noqa: BLE001 - cancelled, or lost with the scheduler
                    if "connection-lost" in str(e) or self.client.status != "running":
                        return self._went_away()
                    return _unavailable(f"the Dask scheduler at {self.address} lost {action['id']} "
                                        f"({type(e).__name__}: {str(e)[:200]})")
                if _hung_up(conn):
                    future.cancel()
                    return None
                if self.client.status != "running":
                    down_since = down_since or time.monotonic()
                    if time.monotonic() - down_since > RECONNECT_GRACE_S:
                        future.cancel()
                        return self._went_away()
                else:
                    down_since = None
        finally:
            with self._lock:
                self._futures.discard(future)

    def _went_away(self) -> dict[str, Any]:
        self.gone = True
        return _unavailable(f"the Dask scheduler at {self.address} went away")

    def _no_toolchain(self, fp: dict[str, Any]) -> str:
        from ctxbuild.engine.farm.task import worker_fingerprints

        try:
            theirs = self.client.run(worker_fingerprints)
        except Exception:  # noqa: BLE001 - only for the message
            theirs = {}
        shown = "; ".join(f"{addr}: {fps}" for addr, fps in sorted(theirs.items())) or "unknown"
        return (f"no Dask worker has the toolchain this action's key needs ({fp}); the workers have: {shown}"
                " (install the same onnxruntime / onnxruntime-qnn / ctxbuild on the workers)")

    def close(self) -> None:
        """Leaving the build (done, failed or ctrl-C): nothing may keep running for it."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            pending = list(self._futures)
        if pending:
            try:
                self.client.cancel(pending)
            except Exception:  # noqa: BLE001 - the scheduler is gone: nothing left to cancel
                pass
        shutil.rmtree(self._dir, ignore_errors=True)


def _offered(resource: str, workers: dict[str, dict[str, Any]]) -> bool:
    return any(resource in (w.get("resources") or {}) for w in workers.values())


def _probe(address: str) -> None:
    """A refused TCP connection fails at once here; the dask Client would retry it until its timeout."""
    parts = urlsplit(address)
    if parts.scheme == "tcp" and parts.hostname and parts.port:
        socket.create_connection((parts.hostname, parts.port), timeout=CONNECT_TIMEOUT_S).close()


def _hung_up(conn: socket.socket) -> bool:
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _unavailable(cause: str) -> dict[str, Any]:
    return {"status": "unavailable", "cause": cause}
