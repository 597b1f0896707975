"""A full cache filesystem never costs the build its report, and its warnings blame the cache (issue 19,
item 14): report.html/report.json were not written ("could not write the build report: OSError: No space
left on device", read as OUT's problem) because the report's compiled template is memoized in the cache."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import keep_only, small_tmpfs


def test_full_cache_keeps_the_report(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    cache_dir.mkdir()
    out = tmp_path / "out"
    with small_tmpfs(cache_dir, "size=16k"):
        (cache_dir / "filler").write_bytes(b"\0" * 12_000)  # what is left: a few small files at most
        r = ctxbuild("build", str(tree), "-o", str(out), "--no-verify")
    assert r.code == 0, r.text
    assert (out / "report.html").is_file() and (out / "report.json").is_file(), r.text
    assert "could not write the build report" not in r.text, r.text
    warnings = [line for line in r.text.splitlines() if "warning" in line]
    assert warnings and all("cache" in w for w in warnings), warnings
    assert all(str(out) not in w for w in warnings), warnings
