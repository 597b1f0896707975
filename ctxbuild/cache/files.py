"""File primitives the stores share: streamed hashing, reflink-or-copy, atomic placement of outputs."""
from __future__ import annotations

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

__all__ = ["copy_hashing", "hash_file", "read_no_follow", "restore_outputs", "same_content", "temp_path"]

CHUNK = 1 << 20
# linux/fs.h: _IOW(0x94, 9, int). fcntl.FICLONE only exists from Python 3.12.
FICLONE = 0x40049409


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
    from the page cache); else a streamed copy that hashes on the way. Memory stays bounded (CHUNK). Never a hardlink: an edit in place of a restored
    output would corrupt the blob, and the output would carry the blob's old mtime, which ninja reads as
    "older than its inputs" and rebuilds forever. `follow=False`: a `src` that is a symbolic link raises
    OSError ELOOP (a cache blob).
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
                    stage: Callable[[OutputEntry, Path], bool]) -> bool:
    """Put every entry's content at dest[name], all or nothing.

    Destinations that already hold the content are left alone, mtime included: ninja's restat then sees
    an unchanged output and does not rebuild what depends on it. The others are staged by `stage(entry,
    tmp)` (which must create `tmp` with verified content, or return False) next to their destination,
    then renamed into place only once every stage succeeded.
    """
    entries = list(entries)
    if {e.name for e in entries} != set(dest):
        return False
    staged: list[tuple[Path, Path]] = []
    try:
        for entry in entries:
            target = dest[entry.name]
            if same_content(target, entry.digest, entry.size):
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
