"""pytest fixtures over a real nginx WebDAV cache on loopback (bench/nginx.py starts it): `nginx_cache`
and `nginx_server`. Test modules load them with `pytest_plugins = ["tests.nginx_fixture"]`."""
from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.nginx import find_nginx, kill_nginx, start_nginx

__all__ = ["NginxCache", "NginxServer", "find_nginx", "kill_nginx", "start_nginx"]


@dataclass(frozen=True)
class NginxCache:
    url: str  # open for reads and writes
    root: Path  # its files: root/ac/<key>, root/cas/<sha256>
    auth_url: str  # the same, but every request needs `Authorization: Bearer <token>`
    auth_root: Path
    token: str


@dataclass(frozen=True)
class NginxServer:
    url: str
    tmpdir: Path  # files under tmpdir/data
    stop: Callable[[], None]

    def kill(self) -> None:
        kill_nginx(self.tmpdir)


@pytest.fixture(scope="session")
def nginx_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxCache]:
    """Two servers shared by the session: open, and token-protected."""
    _skip_without_nginx()
    base = tmp_path_factory.mktemp("nginx")
    token = secrets.token_hex(16)
    with ExitStack() as stack:
        url, stop = start_nginx(base / "open")
        stack.callback(stop)
        auth_url, stop_auth = start_nginx(base / "auth", token)
        stack.callback(stop_auth)
        yield NginxCache(url, base / "open" / "data", auth_url, base / "auth" / "data", token)


@pytest.fixture
def nginx_server(tmp_path: Path) -> Iterator[NginxServer]:
    """A server of the test's own, to stop or kill. Answers at 1 MB/s, so a kill can land mid-transfer."""
    _skip_without_nginx()
    url, stop = start_nginx(tmp_path / "nginx", limit_rate="1m")
    yield NginxServer(url, tmp_path / "nginx", stop)
    stop()


def _skip_without_nginx() -> None:
    if find_nginx() is None:
        pytest.skip("nginx not installed (Debian package: nginx)")
