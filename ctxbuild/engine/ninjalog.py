"""Entries in ninja's build log (OUT/.ctxbuild/.ninja_log) for edges ctxbuild completed itself.

ninja treats an output without a log entry as dirty ("command line not found in log"), so outputs restored
before ninja starts (prerestore.py) get the entry ninja itself would have written after running the edge:
`start_ms<TAB>end_ms<TAB>mtime<TAB>output<TAB>command hash` under the header `# ninja log v7`, the hash being
rapidhash (v1, default seed) of the evaluated command (ninja 1.12-1.13, src/build_log.cc and
src/third_party/rapidhash). The mtime is a filesystem timestamp taken before the edge's key was computed,
as ninja records the command's start time for `restat` edges: an input changed after it makes the edge
dirty again. A wrong entry costs speed, never correctness: ninja re-runs the edge, which restores again.
"""
from __future__ import annotations

import os
from pathlib import Path

LOG_VERSION = 7
HEADER = f"# ninja log v{LOG_VERSION}\n".encode()

_M64 = (1 << 64) - 1
_SEED = 0xBDD89AA982704029
_SECRET = (0x2D358DCCAA6C78A5, 0x8BB84B93962EACC9, 0x4B33A62ED433D4A3)


def _mum(a: int, b: int) -> tuple[int, int]:
    r = a * b
    return r & _M64, r >> 64


def _mix(a: int, b: int) -> int:
    lo, hi = _mum(a, b)
    return lo ^ hi


def _r64(p: bytes, i: int) -> int:
    return int.from_bytes(p[i:i + 8], "little")


def _r32(p: bytes, i: int) -> int:
    return int.from_bytes(p[i:i + 4], "little")


def rapidhash(p: bytes, seed: int = _SEED) -> int:
    """rapidhash v1 (the variant ninja vendors: RAPIDHASH_FAST, little-endian reads)."""
    s = _SECRET
    n = len(p)
    seed ^= _mix(seed ^ s[0], s[1]) ^ n
    if n <= 16:
        if n >= 4:
            last = n - 4
            a = (_r32(p, 0) << 32) | _r32(p, last)
            delta = (n & 24) >> (n >> 3)
            b = (_r32(p, delta) << 32) | _r32(p, last - delta)
        elif n > 0:
            a, b = (p[0] << 56) | (p[n >> 1] << 32) | p[n - 1], 0
        else:
            a = b = 0
    else:
        i, o = n, 0
        if i > 48:
            see1 = see2 = seed
            while i >= 48:  # the unrolled 96-byte loop of the C code computes exactly this
                seed = _mix(_r64(p, o) ^ s[0], _r64(p, o + 8) ^ seed)
                see1 = _mix(_r64(p, o + 16) ^ s[1], _r64(p, o + 24) ^ see1)
                see2 = _mix(_r64(p, o + 32) ^ s[2], _r64(p, o + 40) ^ see2)
                o, i = o + 48, i - 48
            seed ^= see1 ^ see2
        if i > 16:
            seed = _mix(_r64(p, o) ^ s[2], _r64(p, o + 8) ^ seed ^ s[1])
            if i > 32:
                seed = _mix(_r64(p, o + 16) ^ s[2], _r64(p, o + 24) ^ seed)
        a, b = _r64(p, o + i - 16), _r64(p, o + i - 8)
    a, b = _mum(a ^ s[1], b ^ seed)
    return _mix(a ^ s[0] ^ n, b ^ s[1])


def fs_now(state: Path) -> int:
    """The filesystem's clock in ns, as ninja reads it: the mtime of a file written now (state: OUT/.ctxbuild)."""
    path = state / ".ctxbuild_clock"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"x")
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)


def append(state: Path, entries: list[tuple[int, int, int, str, str]]) -> bool:
    """Append (start_ms, end_ms, mtime_ns, output, command) entries to state/.ninja_log. False (nothing
    written) if the log exists in another format: ninja would discard ours."""
    log = state / ".ninja_log"
    try:
        with open(log, "rb") as f:
            head = f.read(len(HEADER))
    except FileNotFoundError:
        head = b""
    if head not in (b"", HEADER):
        return False
    lines = [] if head else [HEADER]
    for start, end, mtime, output, command in entries:
        if "\n" in output or "\t" in output:
            continue  # unrepresentable; ninja runs that edge (and it restores from the cache)
        lines.append(f"{start}\t{end}\t{mtime}\t{output}\t{rapidhash(command.encode()):x}\n".encode())
    with open(log, "ab") as f:  # ninja appends the same way (its log is not atomic either)
        f.write(b"".join(lines))
    return True
