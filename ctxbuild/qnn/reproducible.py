"""Byte-reproducible multi-SoC binaries: the build time QNN writes into the container becomes a fixed one.

A multi-SoC ("flexible") context binary is a zip-format container (stored, CRC fields 0) of per-SoC
contexts plus a JSON member `dlc.metadata<version>` that QNN stamps with the wall-clock time of the
build (`"timestamp": "2026-11-21 23:27:27 UTC"`, six times), so two builds of the same inputs differ.
Neither the EP nor the QNN libraries document an option for it or read SOURCE_DATE_EPOCH (onnxruntime-qnn
2.7.0 / QNN 2.51). So after the compile each stamp is overwritten in place with the reproducible-builds
time: $SOURCE_DATE_EPOCH when set, else the Unix epoch. The text has the same length, so no offset,
size or other byte of the container moves; libQnnSystem reads the result and the EP loads it exactly as
before (tests/e2e/test_reproducible.py).
"""
from __future__ import annotations

import io
import os
import re
import struct
import time
import zipfile

from ctxbuild.errors import ActionError

ENV = "SOURCE_DATE_EPOCH"
_STAMP = re.compile(rb'("timestamp": ")(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)(")')
_METADATA_MEMBER = "dlc.metadata"
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... file name length, extra field length


def build_time() -> str:
    """The time to stamp, in QNN's format: $SOURCE_DATE_EPOCH (UTC) if set, else 1970-01-01 00:00:00 UTC."""
    raw = os.environ.get(ENV, "0")
    if not raw.isdigit() or int(raw) > 253402300799:  # the format has four year digits
        raise ActionError(f"{ENV}={raw!r} is not a Unix time in seconds",
                          "set it to an integer, e.g. `git log -1 --format=%ct`, or unset it")
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(raw)))


def normalize_multi_soc(data: bytes, stamp: str) -> tuple[bytes, int]:
    """`data` with every build time in its metadata member(s) replaced by `stamp`, and how many there were.

    Only the bytes of those members change (a same-length substitution). Raises ValueError if `data` is
    not such a container or a member carries a CRC (then a rewrite would need it recomputed: a format
    ctxbuild has not seen; better to say so than to emit a container that fails its own check)."""
    new = stamp.encode()
    if len(new) != len(b"1970-01-01 00:00:00 UTC"):
        raise ValueError(f"stamp {stamp!r} is not in QNN's format")
    try:
        members = [i for i in zipfile.ZipFile(io.BytesIO(data)).infolist()
                   if i.filename.startswith(_METADATA_MEMBER) and i.compress_type == zipfile.ZIP_STORED]
    except zipfile.BadZipFile as e:
        raise ValueError(f"not a multi-SoC container: {e}") from None
    out, count = bytearray(data), 0
    for info in members:
        if info.CRC != 0:
            raise ValueError(f"member {info.filename} carries a CRC")
        sig, name_len, extra_len = _LOCAL_HEADER.unpack_from(data, info.header_offset)
        if sig != b"PK\x03\x04":
            raise ValueError(f"member {info.filename}: no local header at {info.header_offset}")
        start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        body, n = _STAMP.subn(lambda m: m.group(1) + new + m.group(3), data[start:start + info.compress_size])
        out[start:start + info.compress_size] = body
        count += n
    return bytes(out), count
