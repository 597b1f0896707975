"""A real Dask cluster on loopback: `dask scheduler` and `dask worker` processes (the commands a farm runs),
started with timeouts and always torn down. Used by tests/e2e/test_farm.py and bench/farm_bench.py."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DASK = Path(sys.executable).parent / "dask"
START_TIMEOUT_S = 60.0


class ClusterUnavailable(RuntimeError):
    """Dask is not installed or its processes did not come up: tests skip with this reason."""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    local_dir: Path | None = None  # a worker's --local-directory (its scratch dirs live below)
    address: str | None = None

    def kill(self) -> None:
        """SIGKILL the whole session: a worker with its ctxbuild fork server and action processes."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()


@dataclass
class Cluster:
    address: str
    tmp: Path
    scheduler: Proc
    workers: dict[str, Proc] = field(default_factory=dict)

    def add_workers(self, specs: dict[str, tuple[str, dict[str, str] | None]], nthreads: int = 1) -> None:
        """Start a `dask worker` per name -> (resources, extra environment); wait until the scheduler lists
        them all. Workers on one host share a ctxbuild cache dir, as they would share ~/.cache."""
        started = []
        for name, (resources, extra) in specs.items():
            local = self.tmp / f"worker-{name}"
            env = {**os.environ, "CTXBUILD_CACHE_DIR": str(self.tmp / "worker-cache"), **(extra or {})}
            proc = _start(name, [str(DASK), "worker", self.address, "--name", name, "--nthreads", str(nthreads),
                                 "--no-nanny", "--no-dashboard", "--resources", resources, "--local-directory",
                                 str(local), "--host", "127.0.0.1"], self.tmp, env)
            proc.local_dir = local
            self.workers[name] = proc
            started.append(proc)
        for proc in started:
            proc.address = self._wait_for_worker(proc)

    def _wait_for_worker(self, proc: Proc) -> str:
        from distributed import Client

        deadline = time.monotonic() + START_TIMEOUT_S
        with Client(self.address, timeout=START_TIMEOUT_S, set_as_default=False) as client:
            while time.monotonic() < deadline:
                for addr, info in client.scheduler_info(n_workers=-1)["workers"].items():
                    if info.get("name") == proc.name:
                        return addr
                if proc.popen.poll() is not None:
                    break
                time.sleep(0.1)
        raise ClusterUnavailable(f"dask worker {proc.name} did not register: {_tail(proc.log)}")

    def scratch_dirs(self, name: str, pattern: str) -> list[Path]:
        """A worker's ctxbuild task directories (named after the action's spec) matching `pattern`."""
        local = self.workers[name].local_dir
        try:  # task dirs come and go while we look
            return sorted(local.glob(f"dask-scratch-space/worker-*/ctxbuild/{pattern}")) if local else []
        except FileNotFoundError:
            return []

    def stop(self) -> None:
        """SIGKILL every process group: nothing of the cluster outlives a test, and no graceful wait."""
        for p in [*self.workers.values(), self.scheduler]:
            p.kill()


def start_cluster(tmp: Path) -> Cluster:
    """A scheduler on a free loopback port; add workers with `add_worker`. Call `stop()` when done."""
    try:
        import distributed  # noqa: F401
    except ImportError as e:
        raise ClusterUnavailable(f"distributed is not installed ({e})") from None
    if not DASK.exists():
        raise ClusterUnavailable(f"no `dask` command beside {sys.executable}")
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    sched = _start("scheduler", [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                   tmp, dict(os.environ))
    cluster = Cluster(f"tcp://127.0.0.1:{port}", tmp, sched)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if sched.popen.poll() is not None:
            raise ClusterUnavailable(f"dask scheduler exited: {_tail(sched.log)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return cluster
        except OSError:
            time.sleep(0.05)
    cluster.stop()
    raise ClusterUnavailable(f"dask scheduler did not listen within {START_TIMEOUT_S:g}s: {_tail(sched.log)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(name: str, argv: list[str], tmp: Path, env: dict[str, str]) -> Proc:
    log = tmp / f"{name}.log"
    env.pop("MAKEFLAGS", None)
    with open(log, "wb") as f:
        popen = subprocess.Popen(argv, stdout=f, stderr=f, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    return Proc(name, popen, log)


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
    except OSError:
        return "(no log)"
