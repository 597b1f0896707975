"""Canonical JSON and content digests: files memoized by (path, size, mtime_ns, inode, ctime_ns) like git's index.

Hashing a multi-GB model on every build is not acceptable; a stat() is. The memo lives in a small
SQLite database per OUT directory, which tolerates ninja's concurrent action processes.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any, BinaryIO


def canonical_json(data: Any) -> bytes:
    """The one serialization every key, spec and record digest is taken over: sorted keys, no spaces."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def short_hash(data: Any, n: int = 10) -> str:
    return hashlib.sha256(canonical_json(data)).hexdigest()[:n]


def source_digest(*paths: Path) -> str:
    """sha256 over Python sources (read, not imported): each path a package directory (its *.py) or a file, for
    code whose changes must rebuild what it made (the legalization rules, the LLM exporters' rewrites)."""
    h = hashlib.sha256()
    for path in paths:
        for f in sorted(path.glob("*.py")) if path.is_dir() else [path]:
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def hash_stream(f: BinaryIO) -> tuple[str, int]:
    """sha256 hex digest and byte count of the rest of `f` (the one file hasher of ctxbuild)."""
    start = f.tell()
    digest = hashlib.file_digest(f, "sha256").hexdigest()
    return digest, f.tell() - start


def hash_file(path: Path) -> tuple[str, int]:
    with open(path, "rb") as f:
        return hash_stream(f)


def sha256_file(path: Path) -> str:
    return hash_file(path)[0]


class DigestMemo:
    def __init__(self, db_path: Path | None) -> None:
        self._db: sqlite3.Connection | None = None
        if db_path is not None:
            try:
                db_path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(db_path, timeout=30, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=OFF")  # a memo: losing it on power loss costs a rehash
                self._db.execute("CREATE TABLE IF NOT EXISTS d (path TEXT PRIMARY KEY, stat TEXT, digest TEXT)")
            except sqlite3.Error:
                self._db = None  # a memo is an optimisation: without it we just hash

    def digest(self, path: Path) -> str:
        st = os.stat(path)
        key = str(path.resolve())
        if self._db is not None:
            row = self._db.execute("SELECT stat, digest FROM d WHERE path=?", (key,)).fetchone()
            if row and row[0] == _stamp(st):
                return row[1]
        digest = sha256_file(path)
        # A file modified again within the same mtime tick as it was memoized would be missed (git's "racy"
        # case): ctime_ns and inode in the stamp, and never memoizing a file changed in the last 2 s, avoid it.
        if _settled(st):
            self._store(key, st, digest)
        return digest

    def stamps(self) -> dict[str, str]:
        """Every memoized path -> its stat stamp then (one query: the driver checks all outputs per build)."""
        if self._db is None:
            return {}
        try:
            return dict(self._db.execute("SELECT path, stat FROM d").fetchall())
        except sqlite3.Error:
            return {}

    def remember(self, path: Path, digest: str) -> None:
        """Memoize a file this process just wrote and hashed itself: no one else writes action outputs."""
        self._store(str(path.resolve()), os.stat(path), digest)

    def _store(self, key: str, st: os.stat_result, digest: str) -> None:
        if self._db is None:
            return
        try:
            self._db.execute("INSERT OR REPLACE INTO d VALUES (?,?,?)", (key, _stamp(st), digest))
        except sqlite3.Error:
            pass

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


def stamp_of(path: Path) -> str | None:
    """The memo's stamp of `path` now (None if it is missing)."""
    try:
        return _stamp(os.stat(path))
    except OSError:
        return None


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"


def _settled(st: os.stat_result) -> bool:
    import time

    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > 2_000_000_000
