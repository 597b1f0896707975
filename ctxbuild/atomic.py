"""Atomic file writes (and the matching JSON read): a temp file in the destination directory, fsync, then rename over the target.

`durable=False` skips the fsync (3-10 ms per file here, hundreds per fresh OUT) for OUT's own state
(.ctxbuild: plan, specs, records), which the next build re-derives from recipes and the cache. The write is
atomic either way: an interrupted build leaves the old file or the new one, never half of one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_bytes(path: Path, data: bytes, tmp_dir: Path | None = None, *, durable: bool = True) -> None:
    """Readers see the old file or the whole new one. The temp file goes in `tmp_dir` (same filesystem;
    the cache keeps its own so gc can sweep leftovers), else beside `path`."""
    import tempfile  # not at module level: the no-op build reads but never writes

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=tmp_dir or path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are shared like any other file
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_if_changed(path: Path, data: bytes, *, durable: bool = True) -> bool:
    """Write only when the content differs, so ninja sees an unchanged mtime (restat) when nothing changed."""
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    write_bytes(path, data, durable=durable)
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_json(path: Path) -> Any:
    """A JSON file as written above; None if it is missing, unreadable or not JSON (the state files and
    records are re-derivable: a damaged one counts as absent)."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
