"""The local cache never follows a symbolic link planted inside it (issue 19, item 8): a touched blob once
changed the mtime of the file a link pointed to (/etc/shadow in the probe; here a file of the test's own in
tmp). Links where the store keeps its files or directories are removed, their targets left alone."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ctxbuild.cache import LocalStore

CONTENT = b"compiled context binary\n"
DIGEST = hashlib.sha256(CONTENT).hexdigest()
KEY = hashlib.sha256(b"key").hexdigest()
OLD = 1_000_000_000  # a victim's mtime, far in the past: any touch shows


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim" / "secret.txt"
    v.parent.mkdir()
    v.write_bytes(CONTENT)  # even with the very content the link claims, it is not read through the link
    os.utime(v, (OLD, OLD))
    return v


def _untouched(v: Path) -> None:
    st = v.stat()  # before reading it here: a read through a link shows as a new atime (relatime)
    assert st.st_mtime == OLD and st.st_atime == OLD, st
    assert v.read_bytes() == CONTENT
    assert sorted(p.name for p in v.parent.iterdir()) == [v.name], list(v.parent.iterdir())


def _output(tmp_path: Path) -> dict[str, Path]:
    o = tmp_path / "src" / "a_ctx.bin"
    o.parent.mkdir(exist_ok=True)
    o.unlink(missing_ok=True)  # a second put's output: a new file (the first is a read-only link into the cache)
    o.write_bytes(CONTENT)
    return {"ctx": o}


def test_planted_blob_link_is_never_touched(tmp_path: Path, victim: Path) -> None:
    warnings: list[str] = []
    store = LocalStore(tmp_path / "cache", on_warning=warnings.append)
    blob = store.blob_path(DIGEST)
    blob.parent.mkdir(parents=True)
    blob.symlink_to(victim)
    record = store.put(KEY, _output(tmp_path), None, {})
    _untouched(victim)
    assert not blob.is_symlink() and blob.read_bytes() == CONTENT  # replaced by a real blob
    dest = tmp_path / "restored" / "a_ctx.bin"
    assert store.restore(record, {"ctx": dest}) and dest.read_bytes() == CONTENT


def test_planted_blob_link_is_not_restored_through(tmp_path: Path, victim: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    record = store.put(KEY, _output(tmp_path), None, {})
    blob = store.blob_path(DIGEST)
    blob.unlink()
    blob.symlink_to(victim)
    dest = tmp_path / "restored" / "a_ctx.bin"
    assert not store.restore(record, {"ctx": dest})  # a miss: the action runs
    assert not dest.exists() and not blob.is_symlink()
    _untouched(victim)


def test_planted_record_link_is_a_miss(tmp_path: Path, victim: Path) -> None:
    warnings: list[str] = []
    store = LocalStore(tmp_path / "cache", on_warning=warnings.append)
    record = store.put(KEY, _output(tmp_path), None, {})
    rec = tmp_path / "cache" / "ac" / KEY[:2] / KEY
    victim.write_bytes(rec.read_bytes())  # a valid record, reached only through the link
    os.utime(victim, (OLD, OLD))
    rec.unlink()
    rec.symlink_to(victim)
    assert store.get_record(KEY) is None
    assert victim.stat().st_mtime == OLD and not rec.is_symlink()
    assert any("symbolic link" in w for w in warnings), warnings
    assert record is not None


@pytest.mark.parametrize("where", ["cas", "shard", "tmp", "ac", "seal"])
def test_planted_directory_link_is_not_written_through(tmp_path: Path, victim: Path, where: str) -> None:
    root = tmp_path / "cache"
    link = {"cas": root / "cas", "shard": root / "cas" / DIGEST[:2], "tmp": root / "tmp",
            "ac": root / "ac" / KEY[:2], "seal": root / "seal" / DIGEST[:2]}[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim.parent, target_is_directory=True)
    store = LocalStore(root)
    record = store.put(KEY, _output(tmp_path), b"log", {})
    _untouched(victim)
    assert not link.is_symlink() and link.is_dir()
    assert store.get_record(KEY) == record


def test_gc_and_stats_never_follow_links(tmp_path: Path, victim: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    store.put(KEY, _output(tmp_path), None, {})
    shard = tmp_path / "cache" / "cas" / "ff"
    shard.mkdir()
    (shard / ("f" * 64)).symlink_to(victim)
    assert store.stats()["blobs"] == 1  # the link is not a blob
    store.gc(0)
    _untouched(victim)
    assert not (shard / ("f" * 64)).is_symlink()


def test_memo_directory_link_is_removed(tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxbuild.layout import memo_dir

    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "memo").symlink_to(victim.parent, target_is_directory=True)
    d = memo_dir("plans")
    d.mkdir(parents=True, exist_ok=True)
    (d / "x.json").write_text("{}")
    _untouched(victim)


@pytest.mark.parametrize("entry", ["record", "blob"])
def test_entry_replaced_by_a_directory_heals(tmp_path: Path, entry: str) -> None:
    """Issue 19, item 15: was "cache unavailable" on every build, forever. Now the directory is removed (a
    miss, one warning) and the next store writes the entry again."""
    warnings: list[str] = []
    store = LocalStore(tmp_path / "cache", on_warning=warnings.append)
    record = store.put(KEY, _output(tmp_path), None, {})
    path = tmp_path / "cache" / "ac" / KEY[:2] / KEY if entry == "record" else store.blob_path(DIGEST)
    path.unlink()
    (path / "inside").mkdir(parents=True)
    dest = tmp_path / "restored" / "a_ctx.bin"
    found = store.get_record(KEY)
    assert found is None if entry == "record" else not store.restore(found, {"ctx": dest})
    assert not path.is_dir() and any("directory" in w for w in warnings), warnings
    assert store.put(KEY, _output(tmp_path), None, {}) == record
    assert store.get_record(KEY) == record and store.restore(record, {"ctx": dest}) and dest.read_bytes() == CONTENT
