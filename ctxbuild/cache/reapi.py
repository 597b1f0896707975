"""Action-cache entries in the Bazel HTTP cache format: a REAPI `ActionResult` protobuf under /ac/<key>.

What a Bazel HTTP cache (bazel-remote, BuildBuddy, nginx WebDAV) expects under /ac/ is a serialized
`build.bazel.remote.execution.v2.ActionResult` whose output files name blobs in /cas/ by Digest. An
ActionRecord maps onto it as:

- each output -> an OutputFile, `path` = its role ("ctx", "bin", "ctx:prefill"), `digest` = (sha256, size);
- the action's log -> `stdout_digest` (the log blob is in /cas/ like any other);
- ctxbuild's own metadata (record format, key, `meta`) -> a JSON blob in /cas/, referenced by one more
  OutputFile with the reserved path `.ctxbuild/record.json` (a role never starts with a dot);
- `exit_code` 0: only successful actions are cached.

The message classes are built at run time from descriptors of just the fields used (same package,
message names and field numbers as remote_execution.proto, so any REAPI reader decodes them; fields
other writers set are kept as unknown fields and ignored). No generated code: it would pin a protobuf
runtime version. tests/e2e/test_reapi.py decodes stored entries with the official .proto.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ctxbuild.errors import CacheError
from ctxbuild.cache.record import ActionRecord, OutputEntry, check_digest, check_key

PACKAGE = "build.bazel.remote.execution.v2"
METADATA_PATH = ".ctxbuild/record.json"
METADATA_VERSION = 2  # ctxbuild's part of the entry; version 1 was the whole record as JSON under /ac/

# (message, [(field, number, type, message type or None, repeated)]): a subset of remote_execution.proto.
_MESSAGES = [
    ("Digest", [("hash", 1, "string", None, False), ("size_bytes", 2, "int64", None, False)]),
    ("OutputFile", [("path", 1, "string", None, False), ("digest", 2, "message", "Digest", False),
                    ("is_executable", 4, "bool", None, False)]),
    ("ActionResult", [("output_files", 2, "message", "OutputFile", True), ("exit_code", 4, "int32", None, False),
                      ("stdout_digest", 6, "message", "Digest", False)]),
]


@lru_cache(maxsize=1)
def messages() -> dict[str, Any]:
    """name -> message class, from a private descriptor pool (never clashes with a full REAPI import)."""
    try:
        return _build_messages()
    except Exception as e:  # noqa: BLE001 - an unusable protobuf install: a cache problem, not a failed action
        raise CacheError(f"cannot build the REAPI messages with this protobuf: {type(e).__name__}: {e}",
                         "the remote cache is skipped; install protobuf>=4.25") from None


def _build_messages() -> dict[str, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    types = {"string": F.TYPE_STRING, "int64": F.TYPE_INT64, "int32": F.TYPE_INT32, "bool": F.TYPE_BOOL,
             "message": F.TYPE_MESSAGE}
    fdp = descriptor_pb2.FileDescriptorProto(name="ctxbuild/reapi_subset.proto", package=PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES:
        msg = fdp.message_type.add(name=name)
        for field, number, kind, ref, repeated in fields:
            f = msg.field.add(name=field, number=number, type=types[kind],
                              label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if ref:
                f.type_name = f".{PACKAGE}.{ref}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name, _ in _MESSAGES}


@dataclass(frozen=True)
class Encoded:
    """An ActionRecord as an /ac/ entry plus the metadata blob it references (upload that first)."""

    action_result: bytes
    metadata: bytes
    metadata_digest: str


def encode(record: ActionRecord) -> Encoded:
    m = messages()
    meta = json.dumps({"version": METADATA_VERSION, "key": record.key, "meta": record.meta},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    meta_digest = hashlib.sha256(meta).hexdigest()
    result = m["ActionResult"](exit_code=0)
    for o in sorted(record.outputs, key=lambda o: o.name):
        result.output_files.add(path=o.name, digest=m["Digest"](hash=o.digest, size_bytes=o.size))
    result.output_files.add(path=METADATA_PATH, digest=m["Digest"](hash=meta_digest, size_bytes=len(meta)))
    if record.log_digest is not None and record.log_size is not None:
        result.stdout_digest.CopyFrom(m["Digest"](hash=record.log_digest, size_bytes=record.log_size))
    return Encoded(result.SerializeToString(deterministic=True), meta, meta_digest)


@dataclass(frozen=True)
class Decoded:
    """A parsed /ac/ entry: outputs and log digest; the metadata blob must be fetched to finish the record."""

    outputs: list[OutputEntry]
    log: OutputEntry | None
    metadata: OutputEntry


def decode(data: bytes) -> Decoded | None:
    """None for an entry that is not ctxbuild's (an older JSON record, or another tool's ActionResult):
    a plain miss. Raises ValueError for a malformed one."""
    if data[:1] == b"{":  # the JSON records of ctxbuild before this format
        return None
    from google.protobuf.message import DecodeError

    result = messages()["ActionResult"]()
    try:
        result.ParseFromString(data)
    except DecodeError as e:
        raise ValueError(f"not an ActionResult: {e}") from None
    if result.exit_code != 0:
        raise ValueError(f"exit_code {result.exit_code}")
    entries = [OutputEntry(f.path, check_digest(f.digest.hash), _size(f.digest.size_bytes)) for f in result.output_files]
    metadata = [e for e in entries if e.name == METADATA_PATH]
    if len(metadata) != 1:
        return None
    outputs = [e for e in entries if e.name != METADATA_PATH]
    if len({e.name for e in outputs}) != len(outputs) or any(not e.name for e in outputs):
        raise ValueError("empty or duplicate output paths")
    log = None
    if result.HasField("stdout_digest"):
        log = OutputEntry("stdout", check_digest(result.stdout_digest.hash), _size(result.stdout_digest.size_bytes))
    return Decoded(outputs, log, metadata[0])


def record_of(key: str, decoded: Decoded, metadata: bytes) -> ActionRecord | None:
    """The ActionRecord, given the metadata blob's (verified) bytes; None if it belongs to another format."""
    try:
        obj = json.loads(metadata)
    except ValueError:
        raise ValueError("metadata blob is not JSON") from None
    if not isinstance(obj, dict) or obj.get("version") != METADATA_VERSION:
        return None
    if obj.get("key") != check_key(key):
        raise ValueError("entry stored under another key")
    if not isinstance(obj.get("meta"), dict):
        raise ValueError("meta is not an object")
    log = decoded.log
    return ActionRecord(key, decoded.outputs, log.digest if log else None, obj["meta"], log.size if log else None)


def _size(n: int) -> int:
    if n < 0:
        raise ValueError(f"negative size {n}")
    return n
