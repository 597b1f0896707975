"""A real nginx serving a WebDAV (PUT) cache on loopback, the layout of a Bazel HTTP cache: `start_nginx`.
Needs the Debian package `nginx` (its binary has the dav module). Used by bench/cache_bench.py and by the
tests' fixtures (tests/nginx_fixture.py)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

CONFIG = """\
{user}daemon off;
master_process on;
worker_processes 1;
pid "{tmp}/nginx.pid";
error_log "{tmp}/error.log" warn;
events {{ worker_connections 64; }}
http {{
    access_log "{tmp}/access.log";
    # Every temp path inside tmp: the defaults under /var/lib/nginx may not exist or be writable.
    client_body_temp_path "{tmp}/body";
    proxy_temp_path "{tmp}/proxy";
    fastcgi_temp_path "{tmp}/fastcgi";
    uwsgi_temp_path "{tmp}/uwsgi";
    scgi_temp_path "{tmp}/scgi";
    client_max_body_size 0;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root "{tmp}/data";
        {limit_rate}
        location / {{
            {auth}
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""


def find_nginx() -> str | None:
    """PATH first; /usr/sbin is not on a non-root PATH on Debian."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)


def start_nginx(tmpdir: Path, token: str | None = None, *,
                limit_rate: str | None = None) -> tuple[str, Callable[[], None]]:
    """Serve `tmpdir/data` at the returned URL until `stop_fn()` (idempotent). With `token`, every request
    needs `Authorization: Bearer <token>`; `limit_rate` (e.g. "256k") slows responses. nginx runs in its
    own process group, master pid in `tmpdir/nginx.pid` (see `kill_nginx`)."""
    nginx = find_nginx()
    if nginx is None:
        raise FileNotFoundError("nginx not found (Debian package: nginx)")
    if token is not None and not token.replace("-", "").isalnum():
        raise ValueError("token must be [A-Za-z0-9-] to sit in nginx.conf unquoted")
    tmp = Path(tmpdir).resolve()
    (tmp / "data").mkdir(parents=True, exist_ok=True)
    port = _free_port()
    (tmp / "nginx.conf").write_text(CONFIG.format(
        tmp=tmp, port=port,
        user="user root;\n" if os.geteuid() == 0 else "",  # else workers run as nobody: no access to tmp
        limit_rate=f"limit_rate {limit_rate};" if limit_rate else "",
        auth=f'if ($http_authorization != "Bearer {token}") {{ return 401; }}' if token else ""))
    with open(tmp / "stderr.log", "wb") as stderr:
        proc = subprocess.Popen([nginx, "-p", f"{tmp}/", "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    try:
        _wait_listening(port, proc, tmp)
    except BaseException:
        _stop(proc)
        raise
    return f"http://127.0.0.1:{port}", lambda: _stop(proc)


def kill_nginx(tmpdir: Path) -> None:
    """SIGKILL master and workers at once, as a crash would (killing only the master leaves workers serving)."""
    pid = int((Path(tmpdir) / "nginx.pid").read_text())
    os.killpg(pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen[bytes], tmp: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = b"".join(p.read_bytes() for p in (tmp / "stderr.log", tmp / "error.log") if p.exists())
            raise RuntimeError(f"nginx exited with {proc.returncode}: {log.decode(errors='replace').strip()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nginx did not listen on 127.0.0.1:{port} within {timeout:g}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM is nginx's fast shutdown (master stops its workers); SIGKILL the group if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # also any worker a killed master left behind
    except ProcessLookupError:
        pass
    proc.wait()
