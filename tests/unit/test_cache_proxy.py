"""The remote cache client honours HTTP_PROXY/HTTPS_PROXY/NO_PROXY and keeps its connection alive."""
from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ctxbuild.cache.remote import RemoteStore
from ctxbuild.errors import RemoteUnavailable


class _Server(ThreadingHTTPServer):
    """An HTTP/1.1 server that is both the proxy and the origin: it records the request lines (a proxied
    request names the whole URL) and how many TCP connections carried them, and stores /cas/ blobs."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.blobs: dict[str, bytes] = {}
        self.lines: list[str] = []
        self.connections = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.lines.append(f"GET {self.path}")
        blob = self.server.blobs.get(self.path.rsplit("/", 1)[1])
        self._reply(200, blob) if blob is not None else self._reply(404)

    def do_HEAD(self) -> None:
        self.server.lines.append(f"HEAD {self.path}")
        self._reply(200 if self.path.rsplit("/", 1)[1] in self.server.blobs else 404)

    def do_PUT(self) -> None:
        self.server.lines.append(f"PUT {self.path}")
        self.server.blobs[self.path.rsplit("/", 1)[1]] = self.rfile.read(int(self.headers["Content-Length"]))
        self._reply(201)


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


def _env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
              "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def test_requests_go_through_the_proxy_on_one_connection(server: _Server, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    _env(monkeypatch, HTTP_PROXY=proxy)
    store = RemoteStore("http://cache.invalid:9090/team")  # the host does not resolve: only the proxy can answer
    blobs = [bytes([i]) * (1000 + i) for i in range(5)]
    for b in blobs:
        assert store.put_blob(hashlib.sha256(b).hexdigest(), b)
    for i, b in enumerate(blobs):
        assert store.fetch_blob(hashlib.sha256(b).hexdigest(), tmp_path / f"b{i}")
        assert (tmp_path / f"b{i}").read_bytes() == b
    assert not store.has_blob("0" * 64)
    assert all(line.split()[1].startswith("http://cache.invalid:9090/team/cas/") for line in server.lines)
    assert len(server.lines) == 5 * 2 + 5 + 1  # HEAD + PUT per upload, GET per fetch, one HEAD
    assert server.connections == 1  # kept alive: one TCP connection for all 16 requests


def test_no_proxy_exempts_the_host(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, HTTP_PROXY=f"http://127.0.0.1:{server.server_address[1]}", NO_PROXY="cache.invalid")
    with pytest.raises(RemoteUnavailable, match="unreachable"):
        RemoteStore("http://cache.invalid:9090").has_blob("0" * 64)  # tried directly: the name does not resolve
    assert server.lines == []
    _env(monkeypatch)  # no proxy at all: straight to the server
    port = server.server_address[1]
    assert not RemoteStore(f"http://127.0.0.1:{port}").has_blob("0" * 64)
    assert server.lines == ["HEAD /cas/" + "0" * 64]


def test_a_connection_the_server_closed_is_replaced(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch)
    store = RemoteStore(f"http://127.0.0.1:{server.server_address[1]}")
    assert not store.has_blob("1" * 64)
    for conn in store._idle:  # the server (or a proxy) dropped the idle connection meanwhile
        conn.sock.shutdown(socket.SHUT_RDWR)
    assert not store.has_blob("2" * 64)
    assert server.connections == 2 and len(server.lines) == 2
