"""The cache the action runner uses: an optional local store in front of an optional remote one (any
store.Remote backend; backends.open_cache builds it from the settings).

Contract: no method raises for cache trouble (full or read-only disk, dead or hostile server, corrupt
entries). Each problem becomes one line in `warnings` (each distinct line once) and the worst outcome is
a miss: lookup returns None or restore returns False, and the caller runs the action.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ctxbuild.errors import CacheError, CacheUnavailable, CorruptEntry
from ctxbuild.cache.local import LocalStore
from ctxbuild.cache.record import ActionRecord
from ctxbuild.cache.remote import RemoteSkipped
from ctxbuild.cache.store import Remote, Store

T = TypeVar("T")
LOG_LIMIT = 64 << 20  # a log whose record does not say its size (older local records) is read up to this


class Cache:
    def __init__(self, local: LocalStore | None = None, remote: Remote | None = None) -> None:
        self.local = local
        self.remote = remote
        self.warnings: list[str] = []
        self.hits_local = 0
        self.hits_remote = 0
        self.misses = 0
        self._origin: dict[str, str] = {}  # key -> where lookup found it, counted once restore succeeds
        self._poisoned: set[str] = set()  # remote blobs that failed their digest check: re-uploaded on store
        self.rejected: set[str] = set()  # keys whose restored outputs failed the kind's check: store replaces them
        if local is not None:
            local.on_warning = self._warn

    def lookup(self, key: str) -> ActionRecord | None:
        """Local first; a remote hit is copied into the local store (blobs verified, record last)."""
        record = self._guard(self.local.get_record, key) if self.local is not None else None
        origin = "local"
        if record is None and self.remote is not None:
            record, origin = self._remote_lookup(key), "remote"
        if record is None:
            self.misses += 1
        else:
            self._origin[key] = origin
        return record

    def restore(self, record: ActionRecord, dest: dict[str, Path]) -> bool:
        """Outputs from the local store, else straight from the remote. False: run the action."""
        ok = self._restore(record, dest)
        origin = self._origin.pop(record.key, "local")
        if not ok:
            self.misses += 1
        elif origin == "remote":
            self.hits_remote += 1
        else:
            self.hits_local += 1
        return ok

    def store(self, key: str, outputs: dict[str, Path], log: bytes | None,
              meta: dict[str, Any]) -> ActionRecord | None:
        """Local put, then upload (blobs, then record) unless the remote is read-only. A key already stored
        (another build stored it while this one ran) keeps its first result: see _keep_first."""
        if key not in self.rejected:  # an entry this build rejected (poisoned) is replaced, not kept
            existing = self._guard(self.local.get_record, key) if self.local is not None else None
            if existing is None and self.remote is not None:
                existing = self._remote_lookup(key)
            if existing is not None and (kept := self._keep_first(existing, outputs)) is not None:
                return kept
        record = self._guard(self.local.put, key, outputs, log, meta) if self.local is not None else None
        if self.remote is not None and not self.remote.read_only:
            if record is None:
                record = self._guard(ActionRecord.of_files, key, outputs, log, meta)
            if record is not None:
                self._guard(self._upload, record, outputs, log)
        return record

    def _keep_first(self, existing: ActionRecord, outputs: dict[str, Path]) -> ActionRecord | None:
        """One key, one result. Different bytes for a key the cache holds mean the action is not reproducible
        (or state leaked into it): never replaced silently. The stored result is kept and placed over this
        run's, so every build of the key ships the same bytes, and the difference is a warning naming it.
        None: store this run's result (the same bytes, or the stored result could not be placed)."""
        mine = self._guard(ActionRecord.of_files, existing.key, outputs, None, {})
        if mine is None:
            return None
        theirs = {e.name: e.digest for e in existing.outputs}
        differ = sorted(e.name for e in mine.outputs if theirs.get(e.name) != e.digest)
        if not differ:  # the same bytes: stored again as usual (heals a blob that went missing or bad)
            return None
        if not self._restore(existing, outputs):  # the stored result is gone or bad: this run's replaces it
            return None
        self._warn(f"NOT REPRODUCIBLE: cache key {existing.key[:16]} already holds other bytes for "
                   f"{', '.join(differ)} than this run made; the stored result is kept and placed "
                   "(docs/caching.md, Guarantees)")
        return existing

    def publish(self, key: str) -> bool:
        """Make sure the remote holds `key`'s record and blobs, uploading them from the local store (a hit
        in this machine's local cache was never uploaded). False, with a warning, where it cannot."""
        if self.remote is None or self.local is None or self.remote.read_only:
            return False
        if self._guard(self.remote.get_record, key) is not None:
            return True
        record = self._guard(self.local.get_record, key)
        if record is None:
            return False
        blobs = {e.name: self.local.blob_path(e.digest) for e in record.outputs}
        try:
            self._upload(record, blobs, self._read_log(self.local, record))
        except CacheError as e:
            self._warn(str(e))
            return False
        return True

    def read_log(self, record: ActionRecord) -> bytes | None:
        for store in self._tiers():
            if (log := self._guard(self._read_log, store, record)) is not None:
                return log
        return None

    def _restore(self, record: ActionRecord, dest: dict[str, Path]) -> bool:
        """From the local store, else straight from the remote."""
        return any(self._guard(store.restore, record, dest) for store in self._tiers())

    def _tiers(self) -> list[Store]:
        return [s for s in (self.local, self.remote) if s is not None]

    @staticmethod
    def _read_log(store: Store, record: ActionRecord) -> bytes | None:
        if record.log_digest is None:
            return None
        return store.read_blob(record.log_digest, record.log_size if record.log_size is not None else LOG_LIMIT)

    def _remote_lookup(self, key: str) -> ActionRecord | None:
        assert self.remote is not None
        record = self._guard(self.remote.get_record, key)
        if record is None or self.local is None:
            return record
        try:
            for digest, size in sorted(record.blob_sizes().items()):
                if not self.local.fetch_into(digest, partial(self.remote.fetch_blob, digest, size=size)):
                    return None  # the server lost a blob the record names: a plain miss
            self.local.put_record(record)
        except CacheError as e:
            self._report(e)
            if isinstance(e, CorruptEntry) and e.digest:
                self._poisoned.add(e.digest)
            # Only the local store failed (RemoteUnavailable is a subclass): restore fetches remotely.
            return record if type(e) is CacheUnavailable else None
        return record

    def _upload(self, record: ActionRecord, outputs: dict[str, Path], log: bytes | None) -> None:
        assert self.remote is not None
        for entry in record.outputs:
            # A poisoned blob would otherwise stay: HEAD says "present" and every client keeps missing.
            self.remote.put_blob(entry.digest, outputs[entry.name], overwrite=entry.digest in self._poisoned)
        if log is not None and record.log_digest is not None:
            self.remote.put_blob(record.log_digest, log)
        self.remote.put_record(record)

    def _guard(self, fn: Callable[..., T], *args: Any) -> T | None:
        """Run a store call; cache trouble becomes a warning and None."""
        try:
            return fn(*args)
        except CacheError as e:
            self._report(e)
        except OSError as e:  # an unreadable output or an unwritable destination, outside the stores
            self._warn(f"cache skipped: {e}")
        return None

    def _report(self, e: CacheError) -> None:
        if not isinstance(e, RemoteSkipped):  # skipped on purpose: warned once already (see RemoteSkipped)
            self._warn(str(e))

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
