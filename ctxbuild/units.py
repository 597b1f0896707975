"""The one human-readable size of ctxbuild (report, `inspect`, `cache` commands): binary units; and the
one size parser (`cache gc --max-size`, `--memory-budget`, `--remote-max-download`, `cache.max_download`)."""
from __future__ import annotations

import re

from ctxbuild.errors import UsageError

_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
SIZE_PATTERN = r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT][iI]?)?[bB]?\s*"  # the recipe schema holds a copy
_SIZE = re.compile(SIZE_PATTERN)


def parse_size(text: str, what: str = "cache gc") -> int:
    """`500M`, `2G`, `1.5GiB`, `123456` (bytes). K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti of 1024."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise UsageError(f"{what}: bad size {text!r}", "use a byte count or a number with K, M, G, T (or Ki, Mi, Gi)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


def fmt_size(n: float | None) -> str:
    """512 B, 1.5 KiB, 3.0 MiB ... (powers of 1024, as `cache gc --max-size 2GiB` reads them); None: "—"."""
    if n is None:
        return "—"
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"
