"""Action records: what one cached action produced, as canonical JSON (the action cache's values)."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxbuild.digests import hash_file

FORMAT_VERSION = 1
_DIGEST = re.compile(r"[0-9a-f]{64}")
_KEY = re.compile(r"[0-9a-f]{16,128}")


def check_digest(digest: str) -> str:
    """A sha256 hex digest; anything else could escape the CAS directory when used as a file name."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return digest


def check_key(key: str) -> str:
    """Action keys are lowercase hex (the runner's action hash); they become file and URL names."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"not an action key (16-128 lowercase hex digits): {key!r}")
    return key


@dataclass(frozen=True)
class OutputEntry:
    name: str  # the output's file name within the action's output set, e.g. "mobilenet_ctx.onnx"
    digest: str
    size: int


@dataclass(frozen=True)
class ActionRecord:
    key: str
    outputs: list[OutputEntry]
    log_digest: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    log_size: int | None = None  # the remote format (REAPI stdout_digest) carries it; older records lack it

    def digests(self) -> set[str]:
        """Every blob the record needs: outputs and log."""
        return {o.digest for o in self.outputs} | ({self.log_digest} if self.log_digest else set())

    def blob_sizes(self) -> dict[str, int | None]:
        """Every blob the record needs, with the size it declares (None: a log of an older record)."""
        sizes: dict[str, int | None] = {o.digest: o.size for o in self.outputs}
        if self.log_digest:
            sizes.setdefault(self.log_digest, self.log_size)
        return sizes

    def to_json(self) -> bytes:
        """Canonical bytes: sorted keys and outputs, no whitespace, so equal records are equal bytes."""
        obj = {
            "version": FORMAT_VERSION,
            "key": self.key,
            "outputs": [{"name": o.name, "digest": o.digest, "size": o.size}
                        for o in sorted(self.outputs, key=lambda o: o.name)],
            "log_digest": self.log_digest,
            "meta": self.meta,
        }
        if self.log_size is not None:
            obj["log_size"] = self.log_size
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ActionRecord:
        """Parse and validate; raises ValueError on anything malformed (records may come from a remote)."""
        obj = json.loads(data)
        _require(isinstance(obj, dict) and obj.get("version") == FORMAT_VERSION, "unknown record version")
        outputs = obj.get("outputs")
        _require(isinstance(outputs, list), "outputs is not a list")
        entries = [_entry(o) for o in outputs]
        _require(len({e.name for e in entries}) == len(entries), "duplicate output names")
        log = obj.get("log_digest")
        meta = obj.get("meta")
        _require(isinstance(meta, dict), "meta is not an object")
        log_size = obj.get("log_size")
        _require(log_size is None or (type(log_size) is int and log_size >= 0), "log_size is not a count")
        return cls(check_key(obj.get("key")), entries, None if log is None else check_digest(log), meta, log_size)

    @classmethod
    def of_files(cls, key: str, outputs: dict[str, Path], log: bytes | None, meta: dict[str, Any]) -> ActionRecord:
        """Describe outputs without storing them (hashes each file, streamed)."""
        entries = [OutputEntry(name, *hash_file(path)) for name, path in sorted(outputs.items())]
        log_digest = hashlib.sha256(log).hexdigest() if log is not None else None
        return cls(check_key(key), entries, log_digest, dict(meta), len(log) if log is not None else None)


def _entry(obj: Any) -> OutputEntry:
    _require(isinstance(obj, dict), "output is not an object")
    name, size = obj.get("name"), obj.get("size")
    _require(isinstance(name, str) and name != "", "output name is not a string")
    _require(isinstance(size, int) and not isinstance(size, bool) and size >= 0, "output size is not a count")
    return OutputEntry(name, check_digest(obj.get("digest")), size)


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"malformed action record: {what}")
