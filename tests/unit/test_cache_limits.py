"""A hostile remote cache cannot exhaust memory or disk: every download is bounded by the size its record
declares and by a configurable maximum, and streamed to disk (issue 19, item 7). The server is a tiny
http.server on loopback that lies about sizes and sends bytes without end."""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ctxbuild.cache import ActionRecord, Cache, LocalStore, RemoteStore, reapi
from ctxbuild.cache.record import OutputEntry
from ctxbuild.errors import CacheError, CorruptEntry

HUGE = 3 << 30  # what the server claims to send (it would, at loopback speed, until the client hangs up)
OUTPUT = b"x" * (64 << 10)
KEY = hashlib.sha256(b"hostile").hexdigest()


class Hostile:
    """Serves one real ActionResult whose output is 64 KiB; every /cas/ answer is endless zeros, with a
    Content-Length of 3 GiB (`lie_length`) or none at all (close-delimited). Counts the bytes it sent."""

    def __init__(self, *, lie_length: bool, declared_output: int = len(OUTPUT)) -> None:
        self.lie_length = lie_length
        digest = hashlib.sha256(OUTPUT).hexdigest()
        record = ActionRecord(KEY, [OutputEntry("ctx", digest, declared_output)], None, {"n": 1}, None)
        self.entry = reapi.encode(record)
        self.record = record
        self.sent = 0
        self.lock = threading.Lock()

    def serve(self) -> Iterator[str]:
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("/ac/"):
                    body = hostile.entry.action_result
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                if hostile.lie_length:
                    self.send_header("Content-Length", str(HUGE))
                else:
                    self.send_header("Connection", "close")
                self.end_headers()
                chunk = bytes(1 << 16)
                try:
                    for _ in range(HUGE // len(chunk)):  # bounded, like every loop here
                        self.wfile.write(chunk)
                        with hostile.lock:
                            hostile.sent += len(chunk)
                except OSError:  # the client hung up: what the test wants
                    pass
                self.close_connection = True

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        t = threading.Thread(target=server.serve_forever, daemon=True)
        t.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()


@pytest.fixture(params=[True, False], ids=["lying-length", "no-length"])
def hostile(request: pytest.FixtureRequest) -> Iterator[tuple[Hostile, str]]:
    h = Hostile(lie_length=request.param)
    for url in h.serve():
        yield h, url


def test_metadata_blob_is_bounded(hostile: tuple[Hostile, str]) -> None:
    """The /ac/ entry names a small metadata blob; the server answers it with gigabytes. Read into memory
    before: a MemoryError under a 3 GB limit. Now at most the declared size is read."""
    h, url = hostile
    with pytest.raises(CorruptEntry, match="more than the"):
        RemoteStore(url, timeout=5).get_record(KEY)
    assert h.sent < 64 << 20, h.sent  # socket buffers only; it offered 3 GiB


def test_output_blob_is_bounded_by_its_record(hostile: tuple[Hostile, str], tmp_path: Path) -> None:
    h, url = hostile
    dest = tmp_path / "out.bin"
    with pytest.raises(CorruptEntry, match="more than the 65536 bytes"):
        RemoteStore(url, timeout=5).fetch_blob(h.record.outputs[0].digest, dest, size=len(OUTPUT))
    assert not dest.exists() and list(tmp_path.iterdir()) == []  # the temp file is gone too
    assert h.sent < 64 << 20, h.sent


def test_restore_through_layered_cache_is_bounded(hostile: tuple[Hostile, str], tmp_path: Path) -> None:
    """The runner's path: lookup fetches the record's blobs into the local store, sizes from the record."""
    h, url = hostile
    local = LocalStore(tmp_path / "local")
    cache = Cache(local, RemoteStore(url, timeout=5))
    # get_record also reads the metadata blob from the same endless server: a miss with one warning.
    assert cache.lookup(KEY) is None
    assert len(cache.warnings) == 1 and "more than the" in cache.warnings[0], cache.warnings
    assert h.sent < 64 << 20, h.sent
    assert not any(p.is_file() for p in (tmp_path / "local").rglob("*"))


def test_configured_maximum_refuses_a_big_declared_size(tmp_path: Path) -> None:
    """A record may honestly declare a big output: the maximum (cache.max_download, --remote-max-download)
    refuses it before a byte of it is read, naming the setting."""
    h = Hostile(lie_length=True, declared_output=5 << 30)
    for url in h.serve():
        with pytest.raises(CacheError, match="remote-max-download") as e:
            RemoteStore(url, timeout=5, max_download=1 << 30).fetch_blob(h.record.outputs[0].digest,
                                                                         tmp_path / "o", size=5 << 30)
        assert not isinstance(e.value, CorruptEntry)  # not poisoned: just bigger than allowed
        assert h.sent < 64 << 20


def test_honest_download_within_bounds_still_works(tmp_path: Path) -> None:
    """The bound is exact: a blob of exactly its declared size passes."""
    data = b"y" * 1000
    digest = hashlib.sha256(data).hexdigest()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert RemoteStore(url, timeout=5, max_download=1000).fetch_blob(digest, tmp_path / "ok", size=1000)
        assert (tmp_path / "ok").read_bytes() == data
        with pytest.raises(CorruptEntry):
            RemoteStore(url, timeout=5).fetch_blob(digest, tmp_path / "short", size=999)
    finally:
        server.shutdown()
        server.server_close()


def test_maximum_reaches_the_runner_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--remote-max-download and cache.max_download become $CTXBUILD_REMOTE_MAX_DOWNLOAD for every action."""
    from ctxbuild.cache import open_cache

    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CTXBUILD_REMOTE_CACHE", "http://127.0.0.1:9")
    monkeypatch.setenv("CTXBUILD_REMOTE_MAX_DOWNLOAD", "1000")
    assert open_cache().remote.max_download == 1000


def test_bad_max_download_in_defaults_names_the_line(tmp_path: Path) -> None:
    from ctxbuild.errors import RecipeError
    from ctxbuild.recipes.recipe import load

    (tmp_path / "_defaults.yaml").write_text("cache:\n  remote: http://127.0.0.1:9\n  max_download: lots\n")
    (tmp_path / "m.onnx").write_bytes(b"")
    (tmp_path / "r.yaml").write_text("model: m.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    with pytest.raises(RecipeError, match=r"_defaults.yaml:3: .*max_download"):
        load([tmp_path])
