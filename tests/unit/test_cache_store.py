"""Every store backend keeps the one contract the layered cache relies on (ctxbuild/cache/store.py), and the
cache is built from the settings in one place (ctxbuild/cache/backends.py). A new backend joins BACKEND_NAMES
with the way to write into it and to spoil a blob it holds."""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ctxbuild.cache import ActionRecord, Cache, LocalStore, RemoteStore, open_cache
from ctxbuild.cache.backends import BACKENDS, open_remote, remote_warnings
from ctxbuild.cache.store import Store
from ctxbuild.errors import CorruptEntry, UsageError

if TYPE_CHECKING:
    from tests.nginx_fixture import NginxCache

pytest_plugins = ["tests.nginx_fixture"]

BACKEND_NAMES = ["local", "http"]


@dataclass
class Backend:
    store: Store
    write: Callable[[str, dict[str, Path], bytes, dict], ActionRecord | None]  # key, outputs, log, meta
    spoil: Callable[[str], None]  # overwrite the blob with that digest with other bytes


@pytest.fixture(params=BACKEND_NAMES)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        local = LocalStore(tmp_path / "cache")
        return Backend(local, local.put, lambda d: local.blob_path(d).write_bytes(b"spoiled"))
    nginx: NginxCache = request.getfixturevalue("nginx_cache")
    remote = RemoteStore(nginx.url, timeout=5)
    return Backend(remote, Cache(remote=remote).store, lambda d: (nginx.root / "cas" / d).write_bytes(b"spoiled"))


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def written(backend: Backend, tmp_path: Path, name: str) -> tuple[ActionRecord, dict[str, bytes]]:
    content = {"model.onnx": f"model of {name}".encode() * 1000, "model.bin": f"binary of {name}".encode()}
    (tmp_path / name).mkdir()
    for file, data in content.items():
        (tmp_path / name / file).write_bytes(data)
    record = backend.write(key(name), {f: tmp_path / name / f for f in content}, f"log of {name}".encode(), {"n": 1})
    assert record is not None
    return record, content


def test_records_round_trip_and_a_miss_is_none(backend: Backend, tmp_path: Path) -> None:
    record, _ = written(backend, tmp_path, "round-trip")
    assert backend.store.get_record(record.key) == record
    assert backend.store.get_record(key("never stored")) is None
    assert backend.store.put_record(record) is True and backend.store.get_record(record.key) == record


def test_blobs_are_fetched_checked_and_restored(backend: Backend, tmp_path: Path) -> None:
    record, content = written(backend, tmp_path, "blobs")
    entry = next(e for e in record.outputs if e.name == "model.onnx")
    assert backend.store.fetch_blob(entry.digest, tmp_path / "fetched", entry.size)
    assert (tmp_path / "fetched").read_bytes() == content["model.onnx"]
    assert not backend.store.fetch_blob(hashlib.sha256(b"absent").hexdigest(), tmp_path / "absent")
    assert backend.store.read_blob(record.log_digest, record.log_size) == b"log of blobs"
    dest = {name: tmp_path / "restored" / name for name in content}
    assert backend.store.restore(record, dest)
    assert {n: p.read_bytes() for n, p in dest.items()} == content


def test_a_spoiled_blob_is_never_handed_over(backend: Backend, tmp_path: Path) -> None:
    record, content = written(backend, tmp_path, "spoiled")
    entry = next(e for e in record.outputs if e.name == "model.bin")
    backend.spoil(entry.digest)
    try:
        fetched = backend.store.fetch_blob(entry.digest, tmp_path / "fetched", entry.size)
    except CorruptEntry:  # a remote says so; the local store deletes it and reports a miss
        fetched = False
    assert not fetched and not (tmp_path / "fetched").exists()
    dest = {name: tmp_path / "restored" / name for name in content}
    try:
        restored = backend.store.restore(record, dest)
    except CorruptEntry:
        restored = False
    assert not restored and not any(p.exists() for p in dest.values())  # all or nothing


def test_the_scheme_picks_the_backend() -> None:
    assert set(BACKENDS) == {"http", "https"}
    assert isinstance(open_remote("https://cache.example:9090/team"), RemoteStore)
    with pytest.raises(UsageError, match=r"^remote cache URL 'ftp://cache.example/x' is not http\(s\)://host") as e:
        open_remote("ftp://user:secret@cache.example/x")
    assert "secret" not in str(e.value)


def test_the_cache_follows_the_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CTXBUILD_REMOTE_CACHE", "http://user:pw@127.0.0.1:9/team")
    monkeypatch.setenv("CTXBUILD_REMOTE_READ_ONLY", "1")
    monkeypatch.setenv("CTXBUILD_REMOTE_TIMEOUT", "2.5")
    monkeypatch.setenv("CTXBUILD_REMOTE_MAX_DOWNLOAD", "1000")
    cache = open_cache()
    assert cache is not None and cache.warnings == []
    assert isinstance(cache.local, LocalStore) and cache.local.root == tmp_path / "cache"
    assert isinstance(cache.remote, RemoteStore) and cache.remote.url == "http://127.0.0.1:9/team"
    assert (cache.remote.read_only, cache.remote.timeout, cache.remote.max_download) == (True, 2.5, 1000)
    monkeypatch.setenv("CTXBUILD_NO_CACHE", "1")
    assert open_cache() is None


def test_a_remote_that_cannot_be_set_up_is_a_warning_not_a_failure(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path / "cache"))
    for setting, problem in (({"CTXBUILD_REMOTE_CACHE": "ftp://cache.example/x"}, "is not http(s)://"),
                             ({"CTXBUILD_REMOTE_TIMEOUT": "soon"}, "CTXBUILD_REMOTE_TIMEOUT='soon': expected a number")):
        cache = open_cache({"CTXBUILD_REMOTE_CACHE": "http://127.0.0.1:9", **setting})
        assert cache is not None and cache.remote is None and cache.local is not None
        assert len(cache.warnings) == 1 and cache.warnings[0].startswith("remote cache not used: ")
        assert problem in cache.warnings[0]


def test_the_drivers_check(tmp_path: Path) -> None:
    env = {"CTXBUILD_CACHE_DIR": str(tmp_path), "CTXBUILD_REMOTE_CACHE": "http://127.0.0.1:9",
           "CTXBUILD_REMOTE_TOKEN": "two words"}
    assert remote_warnings(env) == ["the remote cache token is not a valid HTTP header value (control, space or "
                                    "non-ASCII characters inside it); using the remote cache without it"]
    assert remote_warnings({**env, "CTXBUILD_NO_CACHE": "1"}) == []
    with pytest.raises(UsageError):
        remote_warnings({**env, "CTXBUILD_REMOTE_CACHE": "http://127.0.0.1:notaport"})
