"""OUT is owned (issue 46): a directory of the user's is refused, a copied or moved OUT is re-bound before anything is
written and never writes into the original, `clean` removes only what ctxbuild wrote. End to end through the CLI."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import ninja as ninja_pkg
import numpy as np
import onnx
from onnx import numpy_helper

from tests.conftest import keep_only

NINJA = str(Path(ninja_pkg.BIN_DIR) / "ninja")


def _digests(d: Path) -> dict[str, str]:
    """Every file under `d` (OUT's state aside) by its sha256."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file() and ".ctxbuild" not in p.relative_to(d).parts}


def _retrain(model: Path) -> None:
    """A model change: every float weight scaled a little, same graph."""
    m = onnx.load(str(model))
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(a * np.float32(0.9), init.name))
    onnx.save(m, str(model))


def _one(tree: Path) -> None:
    keep_only(tree, "tiny_cnn_int8.yaml")


def test_a_directory_of_the_users_is_refused_and_clean_leaves_it(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _one(tree)
    mine = tmp_path / "mine"
    mine.mkdir()
    for name, text in {"report.html": "<p>my report</p>", "manifest.json": "{}", "build.ninja": "# mine\n"}.items():
        (mine / name).write_text(text)
    before = _digests(mine)
    r = ctxbuild("build", str(tree), "-o", str(mine))
    assert r.code == 2, r.text
    assert r.err.count("\n") == 1 and "not empty and not a ctxbuild output directory" in r.err and str(mine) in r.err
    assert "Traceback" not in r.text
    r = ctxbuild("build", str(tree), "-o", str(mine), "--dry-run")
    assert r.code == 2 and "not a ctxbuild output directory" in r.err, r.text
    r = ctxbuild("clean", "-o", str(mine))
    assert r.code == 0 and "nothing to clean" in r.out, r.text
    assert _digests(mine) == before and sorted(p.name for p in mine.iterdir()) == sorted(before)
    empty = tmp_path / "empty"  # an empty directory is claimed
    empty.mkdir()
    r = ctxbuild("build", str(tree), "-o", str(empty), "--no-verify")
    assert r.code == 0, r.text
    assert json.loads((empty / ".ctxbuild" / "owner.json").read_text())["out"] == str(empty)


def test_a_copied_out_never_writes_into_the_original(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _one(tree)
    out, copy = tmp_path / "out", tmp_path / "copy"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    shutil.copytree(out, copy, symlinks=True)
    original = _digests(out)
    work = sorted(p.name for p in (out / ".ctxbuild" / "work").iterdir())
    # Plain ninja in the copy, not re-bound yet, with a changed model: its specs name the original's paths. Each
    # action refuses with one line; nothing of the original is written or deleted.
    _retrain(tree / "models" / "tiny_cnn.onnx")
    p = subprocess.run([NINJA], cwd=copy, capture_output=True, text=True,
                       env={**os.environ, "CTXBUILD_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode != 0 and "OUT was moved or copied" in p.stdout + p.stderr, p.stdout + p.stderr
    assert _digests(out) == original
    r = ctxbuild("build", str(tree), "-o", str(copy))  # re-bound, then built with the changed model
    assert r.code == 0, r.text
    assert f"{copy} was built as {out}: re-binding it here" in r.err, r.err
    assert _digests(out) == original, "the original OUT changed"
    assert sorted(p.name for p in (out / ".ctxbuild" / "work").iterdir()) == work
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["artifacts"] and all((copy / a["path"]).is_file() for a in manifest["artifacts"])
    assert _digests(copy)["SM8650/tiny_cnn_int8/tiny_cnn_int8_ctx_qnn.bin"] != original[
        "SM8650/tiny_cnn_int8/tiny_cnn_int8_ctx_qnn.bin"]
    assert not any(str(out) in p.read_text(errors="replace") for p in [copy / "build.ninja",
                   *(copy / ".ctxbuild" / "actions").glob("*.json"), copy / ".ctxbuild" / "plan.json"])
    assert json.loads((copy / ".ctxbuild" / "owner.json").read_text())["out"] == str(copy)
    r = ctxbuild("build", str(tree), "-o", str(copy))  # bound now: a no-op
    assert r.code == 0 and "re-binding" not in r.err and "up to date" in r.text, r.text


def test_a_moved_out_is_rebound_and_the_old_place_stays_gone(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _one(tree)
    out, moved = tmp_path / "out", tmp_path / "moved"
    assert ctxbuild("build", str(tree), "-o", str(out)).code == 0
    out.rename(moved)
    (moved / "notes.txt").write_text("mine")
    _retrain(tree / "models" / "tiny_cnn.onnx")
    r = ctxbuild("build", str(tree), "-o", str(moved))
    assert r.code == 0, r.text
    assert not out.exists(), sorted(out.rglob("*"))
    assert (moved / "SM8650" / "tiny_cnn_int8" / "tiny_cnn_int8_ctx.onnx").is_file()
    r = ctxbuild("clean", "-o", str(moved))  # the ledger: only what ctxbuild wrote goes
    assert r.code == 0, r.text
    assert sorted(p.name for p in moved.iterdir()) == ["notes.txt"]
