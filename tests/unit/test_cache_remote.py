"""The remote and layered caches against a real nginx WebDAV server on loopback: round trips, tokens,
read-only mode, poisoned entries, and servers that are down, black holes, or die mid-transfer."""
from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ctxbuild.cache import ActionRecord, Cache, LocalStore, RemoteStore
from ctxbuild.errors import CorruptEntry, RemoteUnavailable, UsageError

if TYPE_CHECKING:  # imported at run time by pytest_plugins only, so pytest can rewrite its asserts
    from tests.nginx_fixture import NginxCache, NginxServer



def key(n: object) -> str:
    return hashlib.sha256(repr(n).encode()).hexdigest()


def outputs(directory: Path, **content: bytes) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {f"{name}.bin": directory / f"{name}.bin" for name in content}
    for name, data in content.items():
        paths[f"{name}.bin"].unlink(missing_ok=True)  # a new file, as ctxbuild writes: an earlier put linked it
        paths[f"{name}.bin"].write_bytes(data)
    return paths


def dest_for(directory: Path, record: ActionRecord) -> dict[str, Path]:
    return {o.name: directory / o.name for o in record.outputs}


def server_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def stored(tmp_path: Path, url: str, name: str, **content: bytes) -> tuple[ActionRecord, dict[str, Path]]:
    """Build a record through a first machine's cache (local + remote) and return it with its outputs."""
    src = outputs(tmp_path / f"{name}-src", **content)
    cache = Cache(LocalStore(tmp_path / f"{name}-first"), RemoteStore(url, timeout=5))
    record = cache.store(key(name), src, f"log of {name}".encode(), {"name": name})
    assert record is not None and cache.warnings == []
    return record, src


def test_round_trip_through_remote(tmp_path: Path, nginx_cache: NginxCache) -> None:
    record, src = stored(tmp_path, nginx_cache.url, "round-trip", model=os.urandom(300_000), ctx=b"ctx")
    assert {f"ac/{record.key}"} | {f"cas/{o.digest}" for o in record.outputs} <= server_files(nginx_cache.root)
    second = LocalStore(tmp_path / "second")
    cache = Cache(second, RemoteStore(nginx_cache.url, timeout=5))
    assert cache.lookup(record.key) == record
    dest = dest_for(tmp_path / "restored", record)
    assert cache.restore(record, dest)
    assert {n: p.read_bytes() for n, p in dest.items()} == {n: p.read_bytes() for n, p in src.items()}
    assert (cache.hits_local, cache.hits_remote, cache.misses) == (0, 1, 0)
    assert cache.read_log(record) == b"log of round-trip" and cache.warnings == []
    offline = Cache(second)  # the hit was copied into the second local store
    assert offline.lookup(record.key) == record and offline.restore(record, dest_for(tmp_path / "again", record))
    assert offline.hits_local == 1


def test_remote_only_cache(tmp_path: Path, nginx_cache: NginxCache) -> None:
    src = outputs(tmp_path / "src", a=b"remote only" * 100)
    cache = Cache(remote=RemoteStore(nginx_cache.url, timeout=5))
    record = cache.store(key("remote-only"), src, b"the log", {})
    assert record is not None and cache.lookup(record.key) == record
    dest = dest_for(tmp_path / "restored", record)
    assert cache.restore(record, dest) and dest["a.bin"].read_bytes() == src["a.bin"].read_bytes()
    assert cache.read_log(record) == b"the log"
    assert cache.lookup(key("never stored")) is None
    assert (cache.hits_remote, cache.misses, cache.warnings) == (1, 1, [])


def test_corrupt_local_blob_is_fetched_again_from_remote(tmp_path: Path, nginx_cache: NginxCache) -> None:
    record, src = stored(tmp_path, nginx_cache.url, "local-corrupt", a=b"A" * 5000)
    local = LocalStore(tmp_path / "local-corrupt-first")
    local.blob_path(record.outputs[0].digest).write_bytes(b"B" * 5000)
    cache = Cache(local, RemoteStore(nginx_cache.url, timeout=5))
    assert cache.lookup(record.key) == record
    dest = dest_for(tmp_path / "restored", record)
    assert cache.restore(record, dest) and dest["a.bin"].read_bytes() == b"A" * 5000
    assert len(cache.warnings) == 1 and "sha256" in cache.warnings[0]


def test_token_is_required_and_never_shown(tmp_path: Path, nginx_cache: NginxCache) -> None:
    good = RemoteStore(nginx_cache.auth_url, token=nginx_cache.token, timeout=5)
    record, _ = stored(tmp_path, nginx_cache.url, "token")  # any record will do: upload it with the token
    assert good.put_record(record) and good.get_record(record.key) == record
    wrong = "wrong-" + nginx_cache.token
    for remote in (RemoteStore(nginx_cache.auth_url, timeout=5),
                   RemoteStore(nginx_cache.auth_url, token=wrong, timeout=5)):
        with pytest.raises(RemoteUnavailable, match="HTTP 401") as failure:
            remote.get_record(record.key)
        cache = Cache(LocalStore(tmp_path / "local"), remote)
        assert cache.lookup(record.key) is None and len(cache.warnings) == 1
        shown = " ".join([str(failure.value), repr(failure.value), repr(remote), *cache.warnings])
        assert nginx_cache.token not in shown and wrong not in shown
    assert nginx_cache.token not in repr(good)
    with_password = RemoteStore(nginx_cache.url.replace("://", "://user:hunter2@"))
    assert "hunter2" not in repr(with_password) and "user" not in with_password.url


def test_read_only_mode_never_puts(tmp_path: Path, nginx_cache: NginxCache) -> None:
    before = server_files(nginx_cache.root)
    remote = RemoteStore(nginx_cache.url, read_only=True, timeout=5)
    cache = Cache(LocalStore(tmp_path / "local"), remote)
    record = cache.store(key("read-only"), outputs(tmp_path / "src", a=os.urandom(1000)), b"log", {})
    assert record is not None and cache.warnings == []
    assert not remote.put_blob(record.outputs[0].digest, b"x") and not remote.put_record(record)
    assert server_files(nginx_cache.root) == before
    assert Cache(remote=RemoteStore(nginx_cache.url, timeout=5)).lookup(record.key) is None


def test_poisoned_blob_is_rejected(tmp_path: Path, nginx_cache: NginxCache) -> None:
    record, _ = stored(tmp_path, nginx_cache.url, "poisoned", a=b"honest output" * 1000)
    blob = nginx_cache.root / "cas" / record.outputs[0].digest
    blob.write_bytes(b"evil output!!" * 1000)  # same size: only the hash can tell
    second = LocalStore(tmp_path / "second")
    cache = Cache(second, RemoteStore(nginx_cache.url, timeout=5))
    assert cache.lookup(record.key) is None and cache.misses == 1
    assert len(cache.warnings) == 1 and "failed its sha256 check" in cache.warnings[0]
    assert second.get_record(record.key) is None and not second.blob_path(record.outputs[0].digest).exists()
    assert list((tmp_path / "second" / "tmp").iterdir()) == []
    remote_only = Cache(remote=RemoteStore(nginx_cache.url, timeout=5))
    assert remote_only.lookup(record.key) == record
    dest = dest_for(tmp_path / "restored", record)
    assert not remote_only.restore(record, dest) and not dest["a.bin"].exists()
    assert "failed its sha256 check" in remote_only.warnings[0]
    with pytest.raises(CorruptEntry):
        RemoteStore(nginx_cache.url).fetch_blob(record.outputs[0].digest, tmp_path / "direct")
    assert not (tmp_path / "direct").exists()


def test_poisoned_record_is_rejected(tmp_path: Path, nginx_cache: NginxCache) -> None:
    record, _ = stored(tmp_path, nginx_cache.url, "bad-record", a=b"a")
    (nginx_cache.root / "ac" / record.key).write_bytes(b"\x12\x05\x0a\x03../\x22")  # truncated ActionResult
    cache = Cache(LocalStore(tmp_path / "second"), RemoteStore(nginx_cache.url, timeout=5))
    assert cache.lookup(record.key) is None and "malformed" in cache.warnings[0]


def test_stopped_server_costs_one_failure(tmp_path: Path, nginx_server: NginxServer) -> None:
    url = nginx_server.url
    nginx_server.stop()
    cache = Cache(LocalStore(tmp_path / "local"), RemoteStore(url, timeout=0.5))
    src = outputs(tmp_path / "src", a=b"a")
    for i in range(5):
        assert cache.lookup(key(i)) is None
        assert cache.store(key(i), src, None, {}) is not None  # the local store still works
    assert len(cache.warnings) == 1 and "refused the connection" in cache.warnings[0]
    assert url in cache.warnings[0] and cache.misses == 5


def test_black_hole_server_costs_one_timeout(tmp_path: Path) -> None:
    """A server that accepts connections and never answers: the worst case for a build."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)  # the kernel completes handshakes; nobody ever reads
        url = f"http://127.0.0.1:{hole.getsockname()[1]}"
        cache = Cache(LocalStore(tmp_path / "local"), RemoteStore(url, timeout=0.3, state_dir=tmp_path / "local"))
        started = time.monotonic()
        for i in range(5):
            assert cache.lookup(key(i)) is None
        assert 0.3 <= time.monotonic() - started < 1.0  # 5 timeouts would be 1.5 s; slack for a loaded CI
        assert cache.warnings == [f"remote cache {url} did not answer within 0.3s (not trying it again for a "
                                  "while; the build goes on without it)"]
        started = time.monotonic()  # another process of the same build: the marker file says "down"
        with pytest.raises(RemoteUnavailable, match="did not answer"):
            RemoteStore(url, timeout=0.3, state_dir=tmp_path / "local").get_record(key(0))
        assert time.monotonic() - started < 0.25
        assert _pending_connections(hole) == 1  # one connection attempt in all, the exact proof


def _pending_connections(listener: socket.socket) -> int:
    listener.setblocking(False)
    count = 0
    while True:
        try:
            listener.accept()[0].close()
        except BlockingIOError:
            return count
        count += 1


def test_server_killed_between_record_and_blob_fetch(tmp_path: Path, nginx_server: NginxServer) -> None:
    url = nginx_server.url
    record, _ = stored(tmp_path, url, "killed-between", a=b"a" * 1000)
    cache = Cache(remote=RemoteStore(url, timeout=2))  # no local store: blobs are fetched by restore
    assert cache.lookup(record.key) == record
    nginx_server.kill()
    dest = dest_for(tmp_path / "restored", record)
    assert not cache.restore(record, dest) and not dest["a.bin"].exists()
    # "refused" or "reset", depending on how far the kernel got in closing the dead server's socket
    assert len(cache.warnings) == 1 and cache.warnings[0].startswith(f"remote cache {url} ")
    assert "not trying it again" in cache.warnings[0]
    assert list((tmp_path / "restored").iterdir()) == []


def test_server_killed_mid_transfer(tmp_path: Path, nginx_server: NginxServer) -> None:
    url = nginx_server.url  # it answers at 1 MB/s: the 3 MB blob takes 3 s unless the server dies first
    record, _ = stored(tmp_path, url, "killed-mid", a=os.urandom(3 << 20))
    local = LocalStore(tmp_path / "second")
    watcher = threading.Thread(target=_kill_when_download_starts, args=(tmp_path / "second" / "tmp", nginx_server))
    watcher.start()
    cache = Cache(local, RemoteStore(url, timeout=2))
    assert cache.lookup(record.key) is None
    watcher.join()
    assert len(cache.warnings) == 1 and "broke the connection" in cache.warnings[0]
    assert local.get_record(record.key) is None and not local.blob_path(record.outputs[0].digest).exists()
    assert list((tmp_path / "second" / "tmp").iterdir()) == []


def _kill_when_download_starts(tmp_dir: Path, server: NginxServer) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _has_bytes(tmp_dir, 1 << 16):  # the 3 MB blob, not the log
        time.sleep(0.005)
    server.kill()


def _has_bytes(directory: Path, least: int) -> bool:
    try:
        return any(p.stat().st_size >= least for p in directory.iterdir())
    except FileNotFoundError:  # not created yet, or a temp renamed away between listing and stat
        return False


def test_bad_url_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="not http"):
        RemoteStore("ftp://user:secret@example.invalid/cache")
    with pytest.raises(UsageError) as failure:
        RemoteStore("http://user:secret@127.0.0.1:notaport/")
    assert "secret" not in str(failure.value)
