"""The local cache shares OUT's bytes by hard link (issue 29, "weights stored once"): a blob and the OUT files
made from it are one inode, read-only; rebuilt outputs are new files, so stored entries keep their bytes; a
blob changed behind the store's back is never restored. By default only large files (16 MiB or more) are linked,
with CTXBUILD_CACHE_LINK=1 every file of 64 KiB or more (ONNX external data included), with 0 none; a store on
another filesystem copies. tests/e2e/test_linked_weights.py reads, quantizes and runs a linked `.data` file."""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from ctxbuild.atomic import write_bytes
from ctxbuild.cache import LocalStore, open_cache
from ctxbuild.cache.files import LINK_LARGE_BYTES, LINK_MIN_BYTES
from tests.conftest import last_build
from tests.e2e.test_cache_build import build, digests, other_tiny_cnn

KEY = hashlib.sha256(b"key").hexdigest()
LINK = {"CTXBUILD_CACHE_LINK": "1"}


def outputs(directory: Path, **content: bytes) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in content}
    for name, data in content.items():
        paths[name].write_bytes(data)
    return paths


def inode(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_dev, st.st_ino


def test_put_and_restore_share_one_read_only_inode(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache", link_min=LINK_MIN_BYTES)
    src = outputs(tmp_path / "out", **{"m_ctx.onnx": b"w" * 300, "m_qnn.bin": b"b" * 70_000,
                                           "m.onnx.data": b"d" * 70_000, "s_qnn.bin": b"small"})
    record = store.put(KEY, src, None, {})
    blobs = {e.name: store.blob_path(e.digest) for e in record.outputs}
    dest = {name: tmp_path / "restored" / name for name in src}
    assert store.restore(record, dest)
    for name in ("m_qnn.bin", "m.onnx.data"):  # external data too: ctxbuild reads it itself
        assert inode(src[name]) == inode(blobs[name]) == inode(dest[name]), name
        assert stat.S_IMODE(blobs[name].stat().st_mode) == 0o444
    for name in ("m_ctx.onnx", "s_qnn.bin"):  # copies: files under 64 KiB
        assert len({inode(src[name]), inode(blobs[name]), inode(dest[name])}) == 3, name
    assert {n: p.read_bytes() for n, p in dest.items()} == {n: p.read_bytes() for n, p in src.items()}


def test_a_rebuilt_output_leaves_the_stored_entry_intact(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache", link_min=LINK_MIN_BYTES)
    src = outputs(tmp_path / "out", **{"a_qnn.bin": b"old" * 30_000})
    record = store.put(KEY, src, None, {})
    write_bytes(src["a_qnn.bin"], b"new" * 30_000)  # as every ctxbuild writer does: a temp file renamed over it
    dest = {"a_qnn.bin": tmp_path / "restored" / "a_qnn.bin"}
    assert store.restore(record, dest) and dest["a_qnn.bin"].read_bytes() == b"old" * 30_000


def test_a_blob_edited_in_place_is_not_restored(tmp_path: Path) -> None:
    """Written through an OUT path (root ignores 0444; anyone else chmods first): caught by the seal's mtime."""
    warnings: list[str] = []
    store = LocalStore(tmp_path / "cache", on_warning=warnings.append, link_min=LINK_MIN_BYTES)
    src = outputs(tmp_path / "out", **{"a_qnn.bin": b"x" * 70_000})
    record = store.put(KEY, src, None, {})
    dest = {"a_qnn.bin": tmp_path / "restored" / "a_qnn.bin"}
    assert store.restore(record, dest)
    os.chmod(dest["a_qnn.bin"], 0o644)
    with open(dest["a_qnn.bin"], "r+b") as f:  # same size: only the mtime moves
        f.write(b"EDITED")
    assert not store.restore(record, {"a_qnn.bin": tmp_path / "again" / "a_qnn.bin"})
    assert not (tmp_path / "again" / "a_qnn.bin").exists()
    assert len(warnings) == 1 and "failed its sha256 check" in warnings[0], warnings
    assert not store.blob_path(record.outputs[0].digest).exists()


@pytest.mark.parametrize("setting, linked", [(None, {"big.data"}), ("1", {"big.data", "a_qnn.bin"}), ("0", set())])
def test_by_default_only_large_files_are_linked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                setting: str | None, linked: set[str]) -> None:
    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path / "cache"))
    if setting is None:
        monkeypatch.delenv("CTXBUILD_CACHE_LINK", raising=False)
    else:
        monkeypatch.setenv("CTXBUILD_CACHE_LINK", setting)
    cache = open_cache()
    assert cache is not None and cache.local is not None
    src = outputs(tmp_path / "out", **{"a_qnn.bin": b"c" * 70_000, "big.data": b"w" * LINK_LARGE_BYTES})
    record = cache.store(KEY, src, None, {})
    assert record is not None
    dest = {name: tmp_path / "restored" / name for name in src}
    assert cache.restore(record, dest)
    for e in record.outputs:
        blob = cache.local.blob_path(e.digest)
        shared = {inode(src[e.name]), inode(blob), inode(dest[e.name])}
        assert len(shared) == (1 if e.name in linked else 3), e.name
        assert bool(src[e.name].stat().st_mode & 0o200) == (e.name not in linked)  # only a linked file is read-only
        assert dest[e.name].read_bytes() == src[e.name].read_bytes()


def test_a_store_on_another_filesystem_copies(tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem here")
    store = LocalStore(other / f"ctxbuild-test-{os.getpid()}", link_min=LINK_MIN_BYTES)
    try:
        src = outputs(tmp_path / "out", **{"a_qnn.bin": b"e" * 70_000})
        record = store.put(KEY, src, None, {})  # link(2) says EXDEV: copied in, and out again
        dest = {"a_qnn.bin": tmp_path / "restored" / "a_qnn.bin"}
        assert store.restore(record, dest) and dest["a_qnn.bin"].read_bytes() == b"e" * 70_000
        assert inode(dest["a_qnn.bin"]) != inode(src["a_qnn.bin"])
    finally:
        shutil.rmtree(store.root)


def test_builds_share_bytes_and_stay_correct(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    """Two OUTs restore one inode; a rebuild after an input change makes new files and keeps the stored entry
    (reverting restores the old bytes); a stored binary edited in place through OUT is rebuilt, not restored."""
    out1, out2, only = tmp_path / "out1", tmp_path / "out2", ("--only", "tiny_cnn_int8")
    model = tree / "models" / "tiny_cnn.onnx"
    original = model.read_bytes()
    build(ctxbuild, tree, out1, *only, env=LINK)
    first = digests(out1)
    build(ctxbuild, tree, out2, *only, env=LINK)
    assert set(last_build(out2).values()) == {"cache"} and digests(out2) == first
    bins = sorted(p.relative_to(out1) for p in out1.rglob("*_qnn.bin"))
    assert bins
    for rel in bins:
        assert inode(out1 / rel) == inode(out2 / rel) and (out1 / rel).stat().st_nlink == 3  # OUT1, OUT2, cas

    other_tiny_cnn(model)
    build(ctxbuild, tree, out1, *only, env=LINK)
    assert last_build(out1)["compile/tiny_cnn_int8@SM8650"] == "run" and digests(out1) != first
    assert digests(out2) == first  # the other OUT and the stored entry kept their bytes
    for rel in bins:
        blob = next((cache_dir / "cas").rglob(hashlib.sha256((out2 / rel).read_bytes()).hexdigest()))
        assert inode(blob) == inode(out2 / rel) and inode(out1 / rel) != inode(out2 / rel)

    model.write_bytes(original)
    build(ctxbuild, tree, out1, *only, env=LINK)
    assert last_build(out1)["compile/tiny_cnn_int8@SM8650"] == "cache" and digests(out1) == first

    edited = out1 / bins[0]
    os.chmod(edited, 0o644)
    with open(edited, "r+b") as f:  # through OUT1 into the blob (and OUT2's file): the same inode
        f.seek(100)
        f.write(b"EDITED")
    r = build(ctxbuild, tree, out1, *only, env=LINK)
    assert last_build(out1)["compile/tiny_cnn_int8@SM8650"] == "run", r.text
    assert digests(out1) == first
