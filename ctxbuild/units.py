"""The one human-readable size of ctxbuild (report, `inspect`, `cache` commands): binary units."""
from __future__ import annotations


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
