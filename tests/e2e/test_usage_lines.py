"""Usage mistakes get one line and exit 2, before any work: no traceback, no stall (issue 19, items 11-12, 19, 22)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import keep_only


def _one_line(r) -> str:
    assert "Traceback" not in r.err, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    return lines[0]


def test_malformed_ipv6_remote_url(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "--remote-cache", "http://[::1")
    line = _one_line(r)
    assert r.code == 2 and "remote cache URL" in line and "http://[::1" in line, line


def test_executor_with_unsupported_scheme_fails_fast(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    t0 = time.monotonic()
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "--executor", "http://127.0.0.1:1",
                 "--remote-cache", "http://127.0.0.1:2")
    took = time.monotonic() - t0
    line = _one_line(r)
    assert r.code == 2 and "--executor" in line and "'http'" in line and "tcp://" in line, line
    # Not a timing claim: the old code waited out dask's 10 s close timeout; a usage error never connects.
    assert took < 10, took


def test_missing_recipe_file_says_no_such_file(tmp_path: Path, ctxbuild) -> None:
    r = ctxbuild("build", "typo.yaml", "-o", str(tmp_path / "out"))
    line = _one_line(r)
    assert r.code == 2 and "typo.yaml: no such file or directory" in line, line
    assert "output directory" not in line
    # run elsewhere than the project, with the default PATHS: the line says where it looked and how to point it there
    r = ctxbuild("build", cwd=tmp_path)
    assert r.code == 2 and _one_line(r) == (f"ctxbuild: error: recipes: no such file or directory in {tmp_path} (give "
                                            "recipe files or directories (default: recipes), or -C the project's "
                                            "directory)"), r.text


@pytest.mark.parametrize("flag, value", [("-j", "-1"), ("--compile-jobs", "-2"), ("--compile-jobs", "0"),
                                         ("-k", "-3"), ("-j", "many")])
def test_negative_counts_are_refused(tree: Path, tmp_path: Path, ctxbuild, flag: str, value: str) -> None:
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "-n", flag, value)
    line = _one_line(r)
    assert r.code == 2 and flag in line, line
    assert not (tmp_path / "out" / "build.ninja").exists()
