"""LocalStore on the real filesystem: round trips, restat-friendly restores, corruption, concurrency,
interrupted inserts, gc, and cache directories that cannot be written (by root too)."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from ctxbuild.cache import ActionRecord, Cache, LocalStore
from ctxbuild.layout import cache_dir
from ctxbuild.errors import CacheUnavailable

FORK = multiprocessing.get_context("fork")


def key(n: object) -> str:
    return hashlib.sha256(repr(n).encode()).hexdigest()


def outputs(directory: Path, **content: bytes) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in content.items():
        paths[f"{name}.bin"] = directory / f"{name}.bin"
        paths[f"{name}.bin"].unlink(missing_ok=True)  # a new file, as ctxbuild writes: an earlier put linked it
        paths[f"{name}.bin"].write_bytes(data)
    return paths


def dest_for(directory: Path, record: ActionRecord) -> dict[str, Path]:
    return {o.name: directory / o.name for o in record.outputs}


def age_blobs(root: Path) -> None:
    """gc spares blobs a put or restore touched (or whose seal it touched) just now: make them old."""
    for sub in ("cas", "seal"):
        for blob in (root / sub).rglob("*"):
            os.utime(blob, (1_000_000, 1_000_000))


def temps(root: Path) -> list[Path]:
    return list((root / "tmp").glob("*")) if (root / "tmp").exists() else []


def test_put_get_restore_round_trip(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    src = outputs(tmp_path / "out", model=b"M" * 5000, ctx=b"C" * 300)
    record = store.put(key(1), src, b"compiler said hi\n", {"seconds": 1.5})
    assert store.get_record(key(1)) == record
    assert ActionRecord.from_json(record.to_json()) == record
    dest = dest_for(tmp_path / "restored", record)
    assert store.restore(record, dest)
    assert {n: p.read_bytes() for n, p in dest.items()} == {n: p.read_bytes() for n, p in src.items()}
    assert store.read_blob(record.log_digest, record.log_size) == b"compiler said hi\n"
    assert store.stats()["entries"] == 1 and store.stats()["blobs"] == 3
    assert store.get_record(key(2)) is None
    assert LocalStore(tmp_path / "never-created").get_record(key(1)) is None


def test_restore_leaves_identical_destination_untouched(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    record = store.put(key(1), outputs(tmp_path / "out", a=b"same" * 100, b=b"old" * 10), None, {})
    dest = dest_for(tmp_path / "restored", record)
    assert store.restore(record, dest)
    os.utime(dest["a.bin"], ns=(1_000_000_000, 1_000_000_000))  # far in the past: any rewrite shows
    dest["b.bin"].unlink()  # ctxbuild never writes an output in place: a new file at that path
    dest["b.bin"].write_bytes(b"new" * 10)  # same size, other content: must be replaced
    inode = dest["a.bin"].stat().st_ino
    assert store.restore(record, dest)
    assert dest["a.bin"].stat().st_mtime_ns == 1_000_000_000 and dest["a.bin"].stat().st_ino == inode
    assert dest["b.bin"].read_bytes() == b"old" * 10


def test_copied_output_does_not_share_storage_with_the_blob(tmp_path: Path) -> None:
    """The copy mode (the default): editing a restored output in place does not reach the cache."""
    store = LocalStore(tmp_path / "cache")
    record = store.put(key(1), outputs(tmp_path / "out", a=b"x" * 4096), None, {})
    dest = dest_for(tmp_path / "restored", record)
    assert store.restore(record, dest)
    with open(dest["a.bin"], "r+b") as f:
        f.write(b"EDITED")
    assert store.restore(record, dest) and dest["a.bin"].read_bytes() == b"x" * 4096


def test_flipped_byte_is_detected_and_blob_deleted(tmp_path: Path) -> None:
    warnings: list[str] = []
    store = LocalStore(tmp_path / "cache", on_warning=warnings.append)
    record = store.put(key(1), outputs(tmp_path / "out", good=b"g" * 1000, bad=b"b" * 1000), None, {})
    blob = store.blob_path(next(o.digest for o in record.outputs if o.name == "bad.bin"))
    data = bytearray(blob.read_bytes())
    data[500] ^= 0x01
    blob.write_bytes(bytes(data))
    dest = dest_for(tmp_path / "restored", record)
    assert not store.restore(record, dest)
    assert not blob.exists()
    assert not any(p.exists() for p in dest.values())  # all or nothing: the good output was not placed
    assert list((tmp_path / "restored").iterdir()) == []  # no temp left beside the destination
    assert len(warnings) == 1 and "sha256" in warnings[0]
    assert not store.restore(record, dest)  # now simply missing


def test_read_blob_rejects_corrupt_log(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    record = store.put(key(1), {}, b"log text", {})
    assert record.log_digest is not None
    store.blob_path(record.log_digest).write_bytes(b"log tExt")
    assert store.read_blob(record.log_digest, 8) is None and not store.blob_path(record.log_digest).exists()


def test_corrupt_record_is_a_miss(tmp_path: Path) -> None:
    warnings: list[str] = []
    store = LocalStore(tmp_path / "cache", on_warning=warnings.append)
    store.put(key(1), outputs(tmp_path / "out", a=b"a"), None, {})
    path = tmp_path / "cache" / "ac" / key(1)[:2] / key(1)
    path.write_bytes(b'{"version": 1, "key": "../../etc"')
    assert store.get_record(key(1)) is None and not path.exists() and warnings


def _writer(root: Path, src_dir: Path, writer: int, rounds: int) -> None:
    store = LocalStore(root)
    src = outputs(src_dir / str(writer), model=f"model from {writer} ".encode() * 2000,
                  ctx=f"ctx from {writer}".encode())
    for _ in range(rounds):
        store.put(key("shared"), src, f"log {writer}".encode(), {"writer": writer})


def _reader(root: Path, dest_dir: Path, rounds: int) -> None:
    """Every record seen must be whole and restorable: blobs are written before the record."""
    store = LocalStore(root)
    for i in range(rounds):
        record = store.get_record(key("shared"))
        if record is None:
            continue
        dest = dest_for(dest_dir / str(i), record)
        assert store.restore(record, dest)
        writer = record.meta["writer"]
        assert dest["ctx.bin"].read_bytes() == f"ctx from {writer}".encode()
        assert dest["model.bin"].read_bytes() == f"model from {writer} ".encode() * 2000


def test_concurrent_puts_of_one_key_leave_a_valid_store(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    procs = [FORK.Process(target=_writer, args=(root, tmp_path / "src", w, 15)) for w in range(4)]
    procs.append(FORK.Process(target=_reader, args=(root, tmp_path / "dest", 60)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    store = LocalStore(root)
    record = store.get_record(key("shared"))
    assert record is not None and store.restore(record, dest_for(tmp_path / "final", record))
    assert store.stats()["entries"] == 1 and store.stats()["blobs"] == 4 * 3  # 4 writers x (2 outputs + log)
    assert temps(root) == []


def _collector(root: Path, rounds: int) -> None:
    store = LocalStore(root)
    for _ in range(rounds):
        store.gc(0)


def test_gc_racing_puts_never_fails(tmp_path: Path) -> None:
    """gc(0) deletes everything it can while writers insert: neither side may fail, only lose entries."""
    root = tmp_path / "cache"
    procs = [FORK.Process(target=_writer, args=(root, tmp_path / "src", w, 15)) for w in range(3)]
    procs.append(FORK.Process(target=_collector, args=(root, 30)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    store = LocalStore(root)
    record = store.put(key("after"), outputs(tmp_path / "after", a=b"a" * 100), None, {})
    assert store.restore(record, dest_for(tmp_path / "restored", record))


def _put_with_file_size_limit(root: Path, src: dict[str, Path], ignore_signal: bool) -> None:
    """RLIMIT_FSIZE binds root too. With SIGXFSZ at the OS default the process dies mid-write (a crash);
    ignored (Python's own default), write(2) fails with EFBIG, as it fails with ENOSPC on a full disk."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN if ignore_signal else signal.SIG_DFL)
    try:  # copies: a hard link writes no bytes, so no limit binds it
        LocalStore(root).put(key(1), src, None, {})
    except CacheUnavailable as e:
        assert "unavailable: File too large" in str(e)
        os._exit(42)
    os._exit(0)


def _run_limited(root: Path, src: dict[str, Path], ignore_signal: bool) -> int | None:
    proc = FORK.Process(target=_put_with_file_size_limit, args=(root, src, ignore_signal))
    proc.start()
    proc.join(30)
    return proc.exitcode


def test_interrupted_insert_is_never_used(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    src = outputs(tmp_path / "out", big=os.urandom(1 << 20))
    assert _run_limited(root, src, ignore_signal=False) == -signal.SIGXFSZ
    leftovers = temps(root)
    assert leftovers and leftovers[0].stat().st_size > 0  # killed mid-copy
    store = LocalStore(root)
    assert store.get_record(key(1)) is None
    assert store.stats()["blobs"] == 0 and store.stats()["entries"] == 0
    record = store.put(key(1), src, None, {})
    dest = dest_for(tmp_path / "restored", record)
    assert store.restore(record, dest) and dest["big.bin"].read_bytes() == src["big.bin"].read_bytes()
    os.utime(leftovers[0], (0, 0))  # gc spares young temps: they may be another process's insert
    store.gc(1 << 30)
    assert not leftovers[0].exists() and store.get_record(key(1)) == record


def test_full_disk_raises_cache_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    src = outputs(tmp_path / "out", big=os.urandom(1 << 20))
    assert _run_limited(root, src, ignore_signal=True) == 42
    assert temps(root) == []  # the failed insert cleaned up after itself
    assert LocalStore(root).get_record(key(1)) is None


def test_cache_dir_under_a_regular_file_raises_cache_unavailable(tmp_path: Path) -> None:
    """ENOTDIR fails for root as for anyone (unlike chmod 0555, which root ignores)."""
    (tmp_path / "file").write_bytes(b"")
    store = LocalStore(tmp_path / "file" / "cache")
    src = outputs(tmp_path / "out", a=b"a")
    for call in (lambda: store.get_record(key(1)), lambda: store.put(key(1), src, None, {}), store.stats,
                 lambda: store.gc(0)):
        with pytest.raises(CacheUnavailable, match="Not a directory"):
            call()
    cache = Cache(store)
    assert cache.lookup(key(1)) is None and cache.store(key(1), src, None, {}) is None
    assert len(cache.warnings) == 1 and "continuing without it" in cache.warnings[0]


@pytest.fixture
def immutable_dir(tmp_path: Path):
    """`chattr +i` stops root too (it only lacks the power if it clears the flag first). Needs a
    filesystem with inode flags (ext4, xfs, btrfs); tmpfs and overlayfs may refuse: then skip."""
    root = tmp_path / "cache"
    root.mkdir()

    def freeze() -> None:
        result = subprocess.run(["chattr", "-R", "+i", str(root)], capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"chattr +i unsupported here: {result.stderr.strip()}")

    yield root, freeze
    if shutil.which("chattr"):
        subprocess.run(["chattr", "-R", "-i", str(root)], capture_output=True)


def test_read_only_cache_dir_serves_hits_and_refuses_puts(tmp_path: Path, immutable_dir) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("chattr not installed (e2fsprogs)")
    root, freeze = immutable_dir
    store = LocalStore(root)
    record = store.put(key(1), outputs(tmp_path / "out", a=b"a" * 100), None, {})
    freeze()
    assert store.get_record(key(1)) == record  # the LRU touch fails quietly
    assert store.restore(record, dest_for(tmp_path / "restored", record))
    with pytest.raises(CacheUnavailable, match="Operation not permitted"):
        store.put(key(2), outputs(tmp_path / "out2", b=b"b"), None, {})
    cache = Cache(store)
    assert cache.store(key(3), outputs(tmp_path / "out3", c=b"c"), None, {}) is None
    assert cache.lookup(key(1)) == record and len(cache.warnings) == 1


def test_gc_keeps_most_recently_used_and_gets_under_size(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    shared = b"S" * 10_000
    records = [store.put(key(i), outputs(tmp_path / str(i), own=bytes([i]) * 10_000, shared=shared), None, {})
               for i in range(6)]
    for i in range(6):  # record mtime is the LRU clock: entry i last used at second i
        os.utime(tmp_path / "cache" / "ac" / key(i)[:2] / key(i), (1_000_000 + i, 1_000_000 + i))
    age_blobs(tmp_path / "cache")
    assert store.get_record(key(0)) is not None  # now the most recently used
    size_of_three = 4 * 10_000 + 3 * len(records[0].to_json())  # shared blob + 3 own blobs + 3 records
    result = store.gc(size_of_three)
    assert result["removed_entries"] == 3 and result["removed_blobs"] == 3
    kept = [i for i in range(6) if store.get_record(key(i)) is not None]
    assert kept == [0, 4, 5]
    assert store.stats()["bytes"] <= size_of_three and store.stats()["last_gc"] == result["time"]
    for i in kept:  # the shared blob survived the records that used it
        assert store.restore(records[i], dest_for(tmp_path / f"r{i}", records[i]))
    age_blobs(tmp_path / "cache")  # a linked restore touched them: used just now
    store.gc(0)
    assert store.stats() == {"entries": 0, "blobs": 0, "bytes": 0, "last_gc": store.stats()["last_gc"]}


def test_clear_empties_the_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    store.put(key(1), outputs(tmp_path / "out", a=b"a"), b"log", {})
    store.gc(1 << 20)
    store.clear()
    assert store.get_record(key(1)) is None
    assert store.stats() == {"entries": 0, "blobs": 0, "bytes": 0, "last_gc": None}


def test_records_reject_names_that_could_escape_the_store(tmp_path: Path) -> None:
    good = json.loads(LocalStore(tmp_path).put(key(1), outputs(tmp_path / "o", a=b"a"), None, {}).to_json())
    for field, value in (("key", "../../etc/passwd"), ("log_digest", "../x")):
        with pytest.raises(ValueError):
            ActionRecord.from_json(json.dumps({**good, field: value}).encode())
    bad_output = {**good, "outputs": [{"name": "a.bin", "digest": "/etc/passwd", "size": 1}]}
    with pytest.raises(ValueError):
        ActionRecord.from_json(json.dumps(bad_output).encode())


def test_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("CTXBUILD_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "ctxbuild"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "ctxbuild"


def test_a_second_different_result_for_one_key_is_refused_loudly(tmp_path: Path) -> None:
    """Issue 19 item 4: one key, one result. The first stored result is kept and placed over a different
    second one, with a warning naming the outputs; the same bytes again are no warning."""
    cache = Cache(LocalStore(tmp_path / "cache"))
    first = outputs(tmp_path / "a", ctx=b"first wrapper", bin=b"first binary")
    assert cache.store(key(1), first, b"log", {}) is not None and not cache.warnings
    same = outputs(tmp_path / "b", ctx=b"first wrapper", bin=b"first binary")
    assert cache.store(key(1), same, b"log", {}) is not None and not cache.warnings
    other = outputs(tmp_path / "c", ctx=b"first wrapper", bin=b"another binary")
    kept = cache.store(key(1), other, b"log", {})
    assert kept is not None and other["bin.bin"].read_bytes() == b"first binary"
    assert len(cache.warnings) == 1 and "NOT REPRODUCIBLE" in cache.warnings[0] and "bin.bin" in cache.warnings[0]
    assert "ctx.bin" not in cache.warnings[0]
    assert {e.name: e.digest for e in cache.lookup(key(1)).outputs} == {
        e.name: e.digest for e in ActionRecord.of_files(key(1), first, None, {}).outputs}
