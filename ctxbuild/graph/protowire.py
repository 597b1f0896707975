"""A wrapper's IR version, metadata and EPContext `ep_sdk_version`, read from the protobuf wire format without
importing onnx (~0.1 s) nor copying an embedded binary: the manifest reads them on every build that changed something, restores included.
Field numbers are onnx.proto's: ModelProto ir_version 1, graph 7, metadata_props 14 (StringStringEntryProto key
1, value 2); GraphProto node 1; NodeProto op_type 4, attribute 5; AttributeProto name 1, s 4."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, int or bytes) of one message, in order; ValueError if `buf` is not one."""
    i = 0
    try:
        while i < len(buf):
            key, i = _varint(buf, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, i = _varint(buf, i)
                yield number, value
            elif wire == 2:
                n, i = _varint(buf, i)
                if i + n > len(buf):
                    raise ValueError("truncated")
                yield number, buf[i:i + n]
                i += n
            elif wire in (1, 5):
                i += 8 if wire == 1 else 4
            else:
                raise ValueError(f"wire type {wire}")
    except IndexError:
        raise ValueError("truncated") from None


def wrapper_facts(path: Path) -> dict[str, Any]:
    """{"ir_version", "metadata": {key: value}, "ep_sdk_versions": [...], "binaries": [external .bin paths relative
    to the wrapper, or "" for a context embedded in it]} of an EPContext model."""
    facts: dict[str, Any] = {"ir_version": 0, "metadata": {}, "ep_sdk_versions": [], "binaries": []}
    for number, value in _fields(memoryview(path.read_bytes())):
        if number == 1 and isinstance(value, int):
            facts["ir_version"] = value
        elif number == 14 and isinstance(value, memoryview):
            entry = dict(_fields(value))
            facts["metadata"][_text(entry.get(1))] = _text(entry.get(2))
        elif number == 7 and isinstance(value, memoryview):
            for attrs in _ep_context_nodes(value):
                facts["ep_sdk_versions"] += [_text(a.get(4)) for a in attrs if a.get(1) == b"ep_sdk_version"]
                embedded = any(a.get(1) == b"embed_mode" and a.get(3) == 1 for a in attrs)
                facts["binaries"] += ["" if embedded else _text(a.get(4)) for a in attrs
                                      if a.get(1) == b"ep_cache_context"]
    facts["binaries"] = list(dict.fromkeys(facts["binaries"]))
    return facts


def _ep_context_nodes(graph: memoryview) -> list[list[dict[int, Any]]]:
    """Each EPContext node's attributes (AttributeProto fields by number: 1 name, 3 i, 4 s)."""
    found = []
    for number, node in _fields(graph):
        if number != 1 or not isinstance(node, memoryview):
            continue
        fields = list(_fields(node))
        if any(n == 4 and v == b"EPContext" for n, v in fields):
            found.append([dict(_fields(attr)) for n, attr in fields if n == 5 and isinstance(attr, memoryview)])
    return found


def _text(v: int | memoryview | None) -> str:
    return bytes(v).decode("utf-8", "replace") if isinstance(v, memoryview) else ""
