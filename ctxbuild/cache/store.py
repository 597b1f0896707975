"""What a cache store is: an action cache (key -> ActionRecord) and a CAS of blobs by sha256, behind one
protocol that the local store (local.py) and every remote backend (remote.py: Bazel's HTTP cache protocol,
its /ac/ entries REAPI ActionResults, see reapi.py) implement. The layered cache (layered.py) talks to its
tiers through it; backends.py picks a remote backend by the URL's scheme and builds the cache from settings.

Errors: CacheError and its subclasses only, never for a plain miss (None or False). CacheUnavailable (or
RemoteUnavailable) when the store cannot be used at all, CorruptEntry for a record or blob that failed
validation; nothing of a corrupt entry is ever used. The layered cache turns each into a warning.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol
from urllib.parse import SplitResult, urlsplit

from ctxbuild.cache.files import restore_outputs
from ctxbuild.cache.record import ActionRecord


class Store(Protocol):
    def get_record(self, key: str) -> ActionRecord | None:
        """The record stored under `key`, validated; None if there is none (or it was not ctxbuild's)."""
        ...

    def put_record(self, record: ActionRecord) -> bool:
        """Store the record, after the blobs it names (no reader may see a record without its blobs).
        False if the store takes no writes."""
        ...

    def fetch_blob(self, digest: str, dest: Path, size: int | None = None) -> bool:
        """Create `dest` (a path that does not exist yet) holding the blob, checked against its digest; False
        if the store lacks it. `size`: what the record declares, the most a download may bring."""
        ...

    def read_blob(self, digest: str, size: int) -> bytes | None:
        """A small blob (a log) of at most `size` bytes, in memory, checked; None if the store lacks it."""
        ...

    def restore(self, record: ActionRecord, dest: dict[str, Path]) -> bool:
        """Place the record's outputs at `dest`, all or nothing (files.restore_outputs). False: a blob is
        missing or failed its check, and the caller runs the action."""
        return restore_outputs(record.outputs, dest, lambda entry, tmp: self.fetch_blob(entry.digest, tmp, entry.size))


class Remote(Store, Protocol):
    """A store behind a URL: what the layered cache, the driver and the farm need of it besides the store
    operations. A backend class is listed in backends.BACKENDS under its URL scheme(s) and constructed as
    `Backend(url, *, token, read_only, timeout, state_dir, min_rate, max_download)` (see RemoteStore for
    their meaning); it raises UsageError for a URL it cannot use."""

    URL_FORM: str  # what its URLs look like, for the message about a URL no backend takes
    url: str  # where it is, as messages show it: never credentials (see shown_url)
    read_only: bool  # it never uploads: configured so, or the server refused an upload

    def put_blob(self, digest: str, data: Path | bytes, *, overwrite: bool = False) -> bool:
        """Store a blob unless it is there (`overwrite`: the copy there is known bad). True if it was written."""
        ...

    def skipped(self) -> str | None:
        """Why this build leaves the store alone without trying it (another process found it down moments
        ago), or None."""
        return None


def shown_url(url: str) -> str:
    """A URL as messages show it: no user, password, query or fragment (also for one that does not parse)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # urlsplit refuses some, e.g. an unclosed "[::1"
        return url.rpartition("@")[2]
    return shown_parts(parts)


def shown_parts(parts: SplitResult) -> str:
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path.rstrip('/')}"
