"""File primitives the stores share: streamed hashing, hard link or reflink-or-copy, atomic placement of outputs."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ctxbuild.digests import hash_file, hash_stream

if TYPE_CHECKING:
    from ctxbuild.cache.record import OutputEntry

__all__ = ["copy_hashing", "discard", "hard_link", "hash_file", "mtime_or_zero", "read_no_follow", "regular_stat",
           "restore_outputs", "same_content", "scandir_list", "stat_identity", "temp_path", "touch_or_drop"]

CHUNK = 1 << 20
# linux/fs.h: _IOW(0x94, 9, int). fcntl.FICLONE only exists from Python 3.12.
FICLONE = 0x40049409
# The smallest file the local store shares by hard link: with CTXBUILD_CACHE_LINK=1, every file but the small ones
# (many outputs hold the same few bytes: empty status files, gates; a linked restore touches every file of its
# inode, which would make ninja re-check what reads each of them); by default, only large ones (docs/caching.md:
# a linked file's costs are per file, its gain per byte, and an LLM's bytes are in files of tens of MB and more).
LINK_MIN_BYTES = 64 << 10
LINK_LARGE_BYTES = 16 << 20
# link(2) refusals that mean "not here", not "broken": another filesystem, a filesystem or policy without hard
# links (FAT, some FUSE and network mounts; protected_hardlinks), the inode's link limit (ext4: 65,000).
NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def temp_path(directory: Path, name: str) -> Path:
    """A unique hidden sibling name; a crash leaves it behind, but nothing ever reads such a name."""
    return directory / f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def same_content(path: Path, digest: str, size: int) -> bool:
    """True if `path` is a regular file holding exactly that content (size compared first: cheap)."""
    try:
        if not path.is_file() or path.stat().st_size != size:
            return False
        return hash_file(path)[0] == digest
    except OSError:
        return False


def read_no_follow(path: Path) -> bytes:
    """The file's bytes; OSError ELOOP if `path` is a symbolic link (O_NOFOLLOW: checked and opened at once)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        return f.read()


def copy_hashing(src: Path, dst: Path, *, durable: bool = True, follow: bool = True) -> tuple[str, int]:
    """Create `dst` (must not exist) with `src`'s content, fsynced if `durable`; return the digest of what
    was copied. Blobs entering the cache are durable; outputs restored into OUT are not, as outputs an
    action writes are not and ninja's are not (fsyncing each cost ~1 ms of a ~4 ms restore).

    Reflink first (instant, shares extents copy-on-write, so later edits of either file never reach the
    other); else copy_file_range (the kernel copies, no bytes through Python; the source is then hashed
    from the page cache); else a streamed copy that hashes on the way. Memory stays bounded (CHUNK). The
    local store links instead where it can (hard_link); this is its fallback and the copy mode.
    `follow=False`: a `src` that is a symbolic link raises OSError ELOOP (a cache blob).
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    with open(os.open(src, flags), "rb") as fin, open(dst, "xb") as fout:
        if _reflink(fin, fout) or _kernel_copy(fin, fout):
            fin.seek(0)
            digest, size = hash_stream(fin)
        else:
            h, size = hashlib.sha256(), 0
            while chunk := fin.read(CHUNK):
                h.update(chunk)
                fout.write(chunk)
                size += len(chunk)
            digest = h.hexdigest()
        fout.flush()
        if durable:
            os.fsync(fout.fileno())
    return digest, size


def hard_link(src: Path, dst: Path) -> bool:
    """Create `dst` (must not exist) as a hard link to `src` (never following a link at `src`); False where
    links are refused (NO_LINK: the caller copies). Other errors raise, FileNotFoundError included."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as e:
        if e.errno in NO_LINK:
            return False
        raise
    return True


def _reflink(fin: BinaryIO, fout: BinaryIO) -> bool:
    try:
        fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
    except OSError:  # EOPNOTSUPP (ext4, tmpfs), EXDEV (other filesystem), ...: the copy handles it
        return False
    return True


def _kernel_copy(fin: BinaryIO, fout: BinaryIO) -> bool:
    """The whole file with os.copy_file_range; False (nothing written) where the kernel or filesystem
    cannot (EXDEV before Linux 5.3, some FUSE and network filesystems)."""
    size = os.fstat(fin.fileno()).st_size
    copied = 0
    try:
        while copied < size:
            n = os.copy_file_range(fin.fileno(), fout.fileno(), min(size - copied, 1 << 30))
            if n == 0:
                break
            copied += n
    except OSError:
        if copied:
            raise
        return False
    return copied == size or _restart(fin, fout)


def _restart(fin: BinaryIO, fout: BinaryIO) -> bool:
    """The source changed size under us: start over with the streamed copy."""
    fout.seek(0)
    fout.truncate()
    fin.seek(0)
    return False


def restore_outputs(entries: Iterable[OutputEntry], dest: dict[str, Path],
                    stage: Callable[[OutputEntry, Path], bool],
                    holds: Callable[[OutputEntry, Path], bool] | None = None) -> bool:
    """Put every entry's content at dest[name], all or nothing.

    Destinations that already hold the content (`holds(entry, path)`, default: same_content) are left alone,
    mtime included: ninja's restat then sees an unchanged output and does not rebuild what depends on it. The
    others are staged by `stage(entry, tmp)` (which must create `tmp` with verified content, or return False)
    next to their destination, then renamed into place only once every stage succeeded.
    """
    holds = holds or (lambda entry, path: same_content(path, entry.digest, entry.size))
    entries = list(entries)
    if {e.name for e in entries} != set(dest):
        return False
    staged: list[tuple[Path, Path]] = []
    try:
        for entry in entries:
            target = dest[entry.name]
            if holds(entry, target):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            staged.append((temp_path(target.parent, target.name), target))
            if not stage(entry, staged[-1][0]):
                return False
        for tmp, target in staged:
            os.replace(tmp, target)
        staged.clear()
        return True
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def scandir_list(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except FileNotFoundError:
        return []


def regular_stat(entry: os.DirEntry[str]) -> os.stat_result | None:
    """A regular file's stat, or None if it is not one or was renamed or deleted since it was listed."""
    try:
        return entry.stat(follow_symlinks=False) if entry.is_file(follow_symlinks=False) else None
    except FileNotFoundError:
        return None


def stat_identity(st: os.stat_result) -> str:
    """What a seal records: a write in place moves the mtime (and usually the size), a replaced file the inode."""
    return f"{st.st_ino} {st.st_size} {st.st_mtime_ns}"


def touch_or_drop(path: Path) -> bool:
    """mtime now; False (the file removed) where that is refused (a blob another user owns: the caller copies)."""
    try:
        os.utime(path)
    except PermissionError:
        path.unlink()
        return False
    return True


def mtime_or_zero(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except FileNotFoundError:
        return 0.0


def discard(path: Path) -> None:
    """Best effort: bad data is never used either way, and a read-only cache cannot delete it."""
    try:
        path.unlink()
    except OSError:
        pass
