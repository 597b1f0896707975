"""The local store (store.Store, plus what only a local tier offers: put, fetch_into, blob_path, stats, gc,
clear): a CAS of blobs by sha256 and an action cache of records, in one directory.

Layout: root/cas/ab/<sha256>, root/ac/ab/<key>, root/seal/ab/<sha256> (see below), root/tmp/ (inserts in
progress), root/stats.json (last gc). Safe for concurrent processes without locks: every file is written under
a unique temp name in root/tmp (same filesystem) and renamed into place, blobs before the record that names
them; blobs are immutable, so two writers of one blob or record write the same or an equally valid whole file.

Hard links (`link_min`: files of that many bytes or more; CTXBUILD_CACHE_LINK, docs/caching.md): a blob and the OUT
files holding its bytes are one inode where the filesystem allows (a store on another filesystem than OUT copies),
so OUT's bytes are not stored twice, ONNX external data included (onnx's loader refuses such a file; ctxbuild reads
weights itself, graph/external_data.py). As in ccache's hard_link mode blobs are read-only (0444), and ctxbuild
writes every output to a temp file renamed into place: a rebuilt output is a new inode and the blob keeps its
bytes. A restore sets the file's mtime to now, as a copy has it (ninja must see a replaced output as newer than
what was built from the old one); the inode is shared, so other OUTs holding the blob see that file touched and
re-check the actions reading it (cache hits). A blob changed behind the store's back (written in place through an OUT path: root
ignores 0444) is caught by its seal, root/seal/ab/<sha256>: the blob's (inode, size, mtime_ns) as the store
last verified or set them. A linked restore trusts a blob whose stat matches its seal and hashes any other
first (a bad one is deleted: a miss); a copy is hashed on the way, as before. An edit in place that also puts
the old mtime back is not seen (nor is it by ninja or git).

Error contract: every operation raises CacheUnavailable when the directory cannot
be read or written (full, read-only, not a directory): the caller warns once and builds without it.
A corrupt blob or record is not an error: it is deleted, reported through `on_warning`, and is a miss.

Symbolic links inside the root are never followed: every file and directory here is the store's own, so
a link found where one belongs was planted; it is removed (never its target) and the entry is a miss. So
is a directory where a record or blob belongs (or a file where a directory does): the next store heals it.
The last path component is opened with O_NOFOLLOW; the store's directories are checked with lstat before
use (a process racing the checks with write access to the cache is out of scope: it can write blobs).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ctxbuild.atomic import write_bytes
from ctxbuild.errors import CacheUnavailable
from ctxbuild.cache.files import (copy_hashing, discard, hard_link, hash_file, mtime_or_zero, read_no_follow,
                                  regular_stat, restore_outputs, same_content, scandir_list, stat_identity, temp_path,
                                  touch_or_drop)
from ctxbuild.digests import hash_stream
from ctxbuild.cache.record import ActionRecord, OutputEntry, check_digest, check_key
from ctxbuild.cache.store import Store

# Temps and unreferenced blobs younger than this may belong to an insert in progress in another process.
GRACE_SECONDS = 600.0
# File times come from the kernel's coarse clock, a tick behind time.time(): a blob touched by a put just
# after gc started can look older than the start. Blobs touched this close to it are spared.
CLOCK_SLACK_SECONDS = 2.0


class LocalStore(Store):
    def __init__(self, root: Path, *, on_warning: Callable[[str], None] | None = None,
                 link_min: int | None = None) -> None:
        self.root = Path(root)
        self.on_warning = on_warning or (lambda message: None)
        # files of link_min bytes or more are stored and restored by hard link where the filesystem takes one;
        # the others (all of them if None) are copied
        self.link_min = link_min

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def blob_path(self, digest: str) -> Path:
        return self.root / "cas" / digest[:2] / check_digest(digest)

    def get_record(self, key: str) -> ActionRecord | None:
        """The record for `key`, or None; marks it used (the record's mtime is gc's LRU clock)."""
        path = self._record_path(key)
        data = self._read(path)
        if data is None:
            return None
        try:
            record = ActionRecord.from_json(data)
            if record.key != key:
                raise ValueError("record stored under another key")
        except ValueError:
            discard(path)
            self.on_warning(f"local cache record {key[:12]} was corrupt; deleted it")
            return None
        try:
            os.utime(path, follow_symlinks=False)
        except OSError:  # a read-only cache still serves hits; LRU order just goes stale
            pass
        return record

    def put(self, key: str, outputs: dict[str, Path], log: bytes | None, meta: dict[str, Any]) -> ActionRecord:
        """Store the outputs' content and the record (last). An unreadable output raises its OSError as is."""
        check_key(key)
        hashed = {name: (os.stat(path), *hash_file(path)) for name, path in sorted(outputs.items())}
        try:
            entries = [OutputEntry(name, *self._add_file(outputs[name], *hashed[name])) for name in hashed]
            log_digest = self._add_bytes(log) if log is not None else None
            record = ActionRecord(key, entries, log_digest, dict(meta), len(log) if log is not None else None)
            self.put_record(record)
        except OSError as e:
            raise self._unavailable(e) from None
        return record

    def put_record(self, record: ActionRecord) -> bool:
        """Insert a record whose blobs are already here (the layered cache's remote hits)."""
        try:
            path = self._record_path(record.key)
            self._own_dir(path.parent)
            write_bytes(path, record.to_json(), self._tmp_dir())
        except OSError as e:
            raise self._unavailable(e) from None
        return True

    def fetch_into(self, digest: str, fetch: Callable[[Path], bool]) -> bool:
        """Add a blob produced by `fetch(path)`, which must write verified content there or return False."""
        final = self.blob_path(digest)
        try:
            if self._is_blob(final):
                return True
            tmp = temp_path(self._tmp_dir(), digest)
            try:
                if not fetch(tmp):
                    return False
                self._place_blob(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as e:
            raise self._unavailable(e) from None
        return True

    def restore(self, record: ActionRecord, dest: dict[str, Path]) -> bool:
        """As Store.restore (a blob that failed its check is deleted); a destination that cannot be written
        also makes this store unavailable for the build."""
        try:
            return restore_outputs(record.outputs, dest,
                                   lambda entry, tmp: self._stage(entry, tmp, self._linked(entry.size)),
                                   self._holds)
        except OSError as e:
            raise self._unavailable(e) from None

    def fetch_blob(self, digest: str, dest: Path, size: int | None = None) -> bool:
        """Create `dest` (must not exist) with the blob's content, checked; False if absent or corrupt (then
        deleted). `size` bounds nothing here: the copy is hashed on the way, a mismatch is a miss."""
        try:
            return self._stage(OutputEntry(dest.name, digest, 0), dest, self._linked(size or 0))
        except OSError as e:
            raise self._unavailable(e) from None

    def _read(self, path: Path) -> bytes | None:
        """The file's bytes, None if absent or a link (removed); any other failure: the cache is unusable."""
        try:
            self._own_dir(path.parent, create=False)
            return read_no_follow(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in _FOREIGN and self._drop_foreign(path):
                return None
            raise self._unavailable(e) from None

    def read_blob(self, digest: str, size: int) -> bytes | None:
        """The blob's bytes, checked (a bad one is deleted: None). `size` bounds nothing: blobs here were
        written by this store."""
        path = self.blob_path(digest)
        data = self._read(path)
        if data is None:
            return None
        if hashlib.sha256(data).hexdigest() != digest:
            self._drop_corrupt(path)
            return None
        return data

    def stats(self) -> dict[str, Any]:
        """Counted by a scan, not kept as counters: counters shared by processes would need a lock."""
        try:
            records, blobs = list(self._files("ac")), list(self._files("cas"))
            last_gc = self._last_gc()
        except OSError as e:
            raise self._unavailable(e) from None
        size = sum(st.st_size for _, st in records) + sum(st.st_size for _, st in blobs)
        return {"entries": len(records), "blobs": len(blobs), "bytes": size, "last_gc": last_gc}

    def gc(self, max_bytes: int) -> dict[str, Any]:
        """Delete stale temps and orphan blobs, then least recently used records (and the blobs only they
        used) until records + blobs take at most `max_bytes`. Returns what it did; also kept in stats.json."""
        try:
            return self._gc(max_bytes, time.time())
        except OSError as e:
            raise self._unavailable(e) from None

    def clear(self) -> None:
        try:
            for sub in ("ac", "cas", "seal", "tmp", "memo"):
                if (self.root / sub).exists():
                    shutil.rmtree(self.root / sub)
            (self.root / "stats.json").unlink(missing_ok=True)
        except OSError as e:
            raise self._unavailable(e) from None

    def _last_gc(self) -> float | None:
        try:
            last = json.loads(read_no_follow(self.root / "stats.json"))
        except (FileNotFoundError, ValueError):  # no gc yet, or a file edited by hand
            return None
        return last.get("time") if isinstance(last, dict) else None

    def _gc(self, max_bytes: int, start: float) -> dict[str, Any]:
        stale = start - GRACE_SECONDS
        for entry in scandir_list(self.root / "tmp"):  # leftovers of inserts that were killed
            st = regular_stat(entry)
            if st is not None and st.st_mtime < stale:
                discard(Path(entry.path))
        blobs = {path.name: (path, st.st_size) for path, st in self._files("cas")}
        for path, st in self._files("seal"):  # seals of blobs gone (deleted as corrupt or foreign)
            if path.name not in blobs and st.st_mtime < stale:
                discard(path)
        records: list[tuple[int, Path, int, set[str]]] = []
        refs: Counter[str] = Counter()
        for path, st in self._files("ac"):
            try:
                digests = ActionRecord.from_json(path.read_bytes()).digests()
            except FileNotFoundError:  # another gc got there first
                continue
            except ValueError:
                discard(path)
                continue
            refs.update(digests)
            records.append((st.st_mtime_ns, path, st.st_size, digests))
        removed_blobs = 0
        for d in [d for d in blobs if refs[d] == 0]:  # orphans: from a killed put, or a record gone
            if self._unlink_unused(blobs[d][0], stale):
                del blobs[d]
                removed_blobs += 1
        total = sum(size for _, _, size, _ in records) + sum(size for _, size in blobs.values())
        removed_entries = 0
        for _, path, size, digests in sorted(records, key=lambda r: r[0]):
            if total <= max_bytes:
                break
            path.unlink(missing_ok=True)
            total, removed_entries = total - size, removed_entries + 1
            for d in digests:
                refs[d] -= 1
                if refs[d] == 0 and d in blobs and self._unlink_unused(blobs[d][0], start - CLOCK_SLACK_SECONDS):
                    total, removed_blobs = total - blobs.pop(d)[1], removed_blobs + 1
        result = {"time": start, "removed_entries": removed_entries, "removed_blobs": removed_blobs,
                  "bytes": total}
        write_bytes(self.root / "stats.json", json.dumps(result).encode(), self._tmp_dir())
        return result

    def _unlink_unused(self, path: Path, older_than: float) -> bool:
        """Delete a blob no record uses (and its seal) unless it was written, restored or reused (its seal
        touched by put) since `older_than`: a concurrent put may be about to name it in a record."""
        seal = self._seal_path(path.name)
        try:
            if max(path.lstat().st_mtime, mtime_or_zero(seal)) >= older_than:
                return False
            path.unlink()
        except FileNotFoundError:
            return False
        discard(seal)
        return True

    def _files(self, sub: str) -> Iterator[tuple[Path, os.stat_result]]:
        """Records or blobs: the files in root/<sub>/<2 hex>/ (temps live in root/tmp, never here). Links
        found on the way are removed, never followed."""
        self._drop_foreign(self.root / sub, is_dir=True)
        for d in scandir_list(self.root / sub):
            if d.is_symlink():
                discard(Path(d.path))
            elif d.is_dir(follow_symlinks=False):
                for entry in scandir_list(Path(d.path)):
                    if entry.is_symlink():
                        discard(Path(entry.path))
                        continue
                    st = regular_stat(entry)
                    if st is not None:
                        yield Path(entry.path), st

    def _stage(self, entry: OutputEntry, tmp: Path, link: bool) -> bool:
        """Create `tmp` with the blob's content, checked: a hard link if `link`, else a copy."""
        blob = self.blob_path(entry.digest)
        try:
            if not self._is_blob(blob):  # never stored, or gc took it: a miss
                return False
            if link:
                if not self._intact(blob, entry.digest):
                    self._drop_corrupt(blob)
                    return False
                if hard_link(blob, tmp) and touch_or_drop(tmp):
                    self._seal(entry.digest, os.lstat(tmp))
                    return True
            digest, _ = copy_hashing(blob, tmp, durable=False, follow=False)  # into OUT
        except FileNotFoundError:  # gc took it meanwhile: a miss
            return False
        except OSError as e:
            if e.errno in _FOREIGN and self._drop_foreign(blob):
                return False
            raise
        if digest != entry.digest:
            self._drop_corrupt(blob)
            tmp.unlink()  # what was copied is not the blob's content: nothing of it stays
            return False
        return True

    def _linked(self, size: int) -> bool:
        return self.link_min is not None and size >= self.link_min

    def _holds(self, entry: OutputEntry, target: Path) -> bool:
        """`target` already holds the entry's bytes: it is the blob itself (a link made by an earlier restore or
        put, checked as a linked restore checks the blob), or a file of that content (hashed)."""
        blob = self.blob_path(entry.digest)
        try:
            self._own_dir(blob.parent, create=False)
            t, b = os.lstat(target), os.lstat(blob)
        except FileNotFoundError:
            return same_content(target, entry.digest, entry.size)
        if (t.st_dev, t.st_ino) == (b.st_dev, b.st_ino) and stat.S_ISREG(b.st_mode):
            return self._intact(blob, entry.digest)
        return same_content(target, entry.digest, entry.size)

    def _intact(self, blob: Path, digest: str) -> bool:
        """The blob holds `digest`'s bytes: its stat is the one its seal records, or its content hashes to it
        (then it is sealed again: the next restore need not hash)."""
        st = os.lstat(blob)
        if self._seal_of(digest) == stat_identity(st):
            return True
        with open(os.open(blob, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
            ok = hash_stream(f)[0] == digest
            unchanged = stat_identity(os.fstat(f.fileno())) == stat_identity(st)
        if ok and unchanged:
            self._seal(digest, st)
        return ok

    def _seal_path(self, digest: str) -> Path:
        return self.root / "seal" / digest[:2] / check_digest(digest)

    def _seal_of(self, digest: str) -> str | None:
        data = self._read(self._seal_path(digest))
        return data.decode(errors="replace") if data is not None else None

    def _seal(self, digest: str, st: os.stat_result) -> None:
        """Record the blob's stat as verified. Best effort: without a seal the next linked restore hashes."""
        path = self._seal_path(digest)
        try:
            self._own_dir(path.parent)
            write_bytes(path, stat_identity(st).encode(), self._tmp_dir(), durable=False)
        except OSError:
            pass

    def _add_file(self, src: Path, st: os.stat_result, digest: str, size: int) -> tuple[str, int]:
        """Insert `src` unless its blob exists; returns the digest of what was stored. `st`: its stat before
        `digest` was taken. A link is stored only if the file is still what was hashed (the same stat); else
        it is copied, and the copy hashed on the way: an output rewritten since is stored under its true digest."""
        if self._reuse(digest):
            return digest, size
        tmp = temp_path(self._tmp_dir(), digest)
        try:
            if not (self._linked(size) and hard_link(src, tmp)
                    and stat_identity(os.lstat(tmp)) == stat_identity(st)):
                tmp.unlink(missing_ok=True)
                digest, size = copy_hashing(src, tmp)
            self._place_blob(tmp, self.blob_path(digest))
        finally:
            tmp.unlink(missing_ok=True)
        return digest, size

    def _place_blob(self, tmp: Path, final: Path) -> None:
        """Move a verified blob into place, read-only (a link shares the mode with its OUT file) and sealed."""
        os.chmod(tmp, 0o444)
        st = os.lstat(tmp)
        self._own_dir(final.parent)
        os.replace(tmp, final)
        self._seal(final.name, st)

    def _add_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self._reuse(digest):
            blob = self.blob_path(digest)
            self._own_dir(blob.parent)
            write_bytes(blob, data, self._tmp_dir())
            os.chmod(blob, 0o444, follow_symlinks=False)
        return digest

    def _reuse(self, digest: str) -> bool:
        """True if the blob exists; touching its seal (else the blob: never an OUT file's mtime if it can)
        tells a concurrent gc it is about to be referenced."""
        path = self.blob_path(digest)
        if not self._is_blob(path):
            return False
        seal = self._seal_path(digest)
        for p in (seal, path):
            try:
                self._own_dir(p.parent, create=False)
                os.utime(p, follow_symlinks=False)
                return True
            except FileNotFoundError:
                continue
        return False

    def _is_blob(self, path: Path) -> bool:
        """A regular file of the store's own at `path`; anything else there is removed (a miss)."""
        self._own_dir(path.parent, create=False)
        self._drop_foreign(path)
        return os.path.lexists(path)

    def _own_dir(self, path: Path, *, create: bool = True) -> Path:
        """`path` (root/<sub> or root/<sub>/<2 hex>) without a link in it below the root; created if asked."""
        d = self.root
        for part in path.relative_to(self.root).parts:
            d = d / part
            self._drop_foreign(d, is_dir=True)
        if create:
            path.mkdir(parents=True, exist_ok=True)
        return path

    def _drop_foreign(self, path: Path, *, is_dir: bool = False) -> bool:
        """Remove what is at `path` unless it is what the store keeps there (a regular file, or with `is_dir`
        a directory): a planted link (never its target), or a directory where a file belongs. True if
        something was removed."""
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(mode):
            what = "a symbolic link"
        elif stat.S_ISDIR(mode) if is_dir else stat.S_ISREG(mode):
            return False
        else:
            what = "a directory" if stat.S_ISDIR(mode) else "not a directory" if is_dir else "not a regular file"
        if stat.S_ISDIR(mode):
            shutil.rmtree(path)  # removes links inside, never follows them
        else:
            path.unlink()
        self.on_warning(f"local cache: {path} was {what}; removed it (never followed)")
        return True

    def _drop_corrupt(self, blob: Path) -> None:
        discard(blob)
        discard(self._seal_path(blob.name))
        self.on_warning(f"local cache blob {blob.name[:12]} failed its sha256 check; deleted it")

    def _record_path(self, key: str) -> Path:
        return self.root / "ac" / key[:2] / check_key(key)

    def _tmp_dir(self) -> Path:
        return self._own_dir(self.root / "tmp")

    def _unavailable(self, e: OSError) -> CacheUnavailable:
        return CacheUnavailable(f"local cache {self.root} unavailable: {e.strerror or e}",
                                "continuing without it")


_FOREIGN = (errno.ELOOP, errno.EISDIR)  # opening a record or blob found a link, or a directory
