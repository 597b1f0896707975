"""A corrupt .npz/.npy (a calibration or verification sample, a LoRA adapter) is one line naming the file
(issue 19, item 23): a file that is not a zip got numpy's advice to load it with allow_pickle=True (which
would run code from it), a truncated zip a BadZipFile traceback."""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ctxbuild.errors import ActionError
from ctxbuild.graph.samples import load_sample
from ctxbuild.lora.adapters import read_file


def _corrupt(path: Path, kind: str) -> Path:
    if kind == "garbage":
        path.write_bytes(b"this is not an array file\n" * 10)
    elif kind == "truncated":
        buf = io.BytesIO()
        np.savez(buf, x=np.ones((64, 64), np.float32))
        path.write_bytes(buf.getvalue()[:300])
    elif kind == "objects":
        np.savez(path, x=np.array([{"a": 1}], dtype=object))
    elif kind == "bad-member":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("x.npy", b"\x93NUMPY garbage")
    else:
        path.write_bytes(b"")
    return path


KINDS = ["garbage", "truncated", "objects", "bad-member", "empty"]


def _one_line_naming(e: ActionError, path: Path) -> None:
    text = str(e)
    assert str(path) in text and "\n" not in text, text
    assert "allow_pickle" not in text, text


@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_sample(tmp_path: Path, kind: str) -> None:
    path = _corrupt(tmp_path / "s0.npz", kind)
    with pytest.raises(ActionError) as e:
        load_sample(path, {"x": ((64, 64), np.dtype(np.float32))})
    _one_line_naming(e.value, path)


@pytest.mark.parametrize("kind", ["garbage", "truncated", "objects", "empty"])
def test_corrupt_npy_sample(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "s0.npy"
    if kind == "objects":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "truncated":
        np.save(path, np.ones((64, 64), np.float32))
        path.write_bytes(path.read_bytes()[:100])
    else:
        _corrupt(path, kind)
    with pytest.raises(ActionError) as e:
        load_sample(path, {"x": ((64, 64), np.dtype(np.float32))})
    _one_line_naming(e.value, path)


@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_adapter(tmp_path: Path, kind: str) -> None:
    path = _corrupt(tmp_path / "a.npz", kind)
    with pytest.raises(ActionError) as e:
        read_file(path)
    _one_line_naming(e.value, path)


def test_good_files_still_load(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "s.npy", x)
    np.savez(tmp_path / "s.npz", x=x)
    spec = {"x": ((3, 4), np.dtype(np.float32))}
    assert np.array_equal(load_sample(tmp_path / "s.npy", spec)["x"], x)
    assert np.array_equal(load_sample(tmp_path / "s.npz", spec)["x"], x)
    assert np.array_equal(read_file(tmp_path / "s.npz")["x"], x)
