"""A model that is not a regular ONNX file gets a precise line at plan time (issue 19, item 20): a FIFO
and /dev/zero were "not found", a 0-byte model failed in prepare with "'image' is not an input"."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import keep_only


def _make(models: Path, kind: str) -> str:
    if kind == "fifo":
        os.mkfifo(models / "fifo.onnx")
        return "models/fifo.onnx"
    if kind == "dev-zero":
        return "/dev/zero"
    if kind == "link-to-dev-zero":
        (models / "zero.onnx").symlink_to("/dev/zero")
        return "models/zero.onnx"
    if kind == "directory":
        (models / "dir.onnx").mkdir()
        return "models/dir.onnx"
    (models / "empty.onnx").write_bytes(b"")
    return "models/empty.onnx"


@pytest.mark.parametrize("kind, expect", [
    ("fifo", "is a FIFO, not a regular file"),
    ("dev-zero", "is a character device, not a regular file"),
    ("link-to-dev-zero", "is a character device, not a regular file"),
    ("directory", "is a directory"),
    ("empty", "is empty (0 bytes)"),
])
def test_model_that_is_not_a_file(tree: Path, tmp_path: Path, ctxbuild, kind: str, expect: str) -> None:
    keep_only(tree)
    model = _make(tree / "models", kind)
    (tree / "odd.yaml").write_text(f"model: {model}\nprecision: fp16\ntargets: [SM8650]\n")
    r = ctxbuild("plan", str(tree), "-o", str(tmp_path / "out"), timeout=60)
    assert r.code == 2, r.text
    line = r.err.strip().splitlines()[-1]
    assert "odd.yaml:1:" in line and f"model '{model}'" in line and expect in line, line
    assert "not found" not in line


def test_prebuilt_binary_that_is_a_fifo(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree)
    os.mkfifo(tree / "models" / "ctx.bin")
    (tree / "pre.yaml").write_text("prebuilt:\n  bin: models/ctx.bin\ntargets: [SM8650]\n")
    r = ctxbuild("plan", str(tree), "-o", str(tmp_path / "out"), timeout=60)
    assert r.code == 2, r.text
    line = r.err.strip().splitlines()[-1]
    assert "pre.yaml:2:" in line and "is a FIFO, not a regular file" in line, line
