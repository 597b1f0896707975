"""Builds that end in a refusal or a warning naming what is wrong (issue 46): a package whose second target failed,
a FIFO among the samples, fewer samples than asked. Each a build of its own: in FULL_FILES (make test-full)."""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import keep_only
from tests.e2e.test_refusals import _odd_entry


def test_a_package_whose_second_target_failed_is_not_left_without_its_manifest(tree: Path, tmp_path: Path,
                                                                              ctxbuild) -> None:
    """SM8350's compile runs out of memory at optimization_mode 3 (measured, onnxruntime-qnn 2.7.0): the package's
    manifest is never made, so the SM8650 variant goes aside with it, not left as a package an app would open."""
    keep_only(tree)
    (tree / "m.yaml").write_text("model: models/mlp.onnx\nprecision: fp16\ntargets: [SM8650, SM8350]\npackage: true\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1 and "FAILED compile/m@SM8350" in r.err, r.text
    assert not (out / "packages" / "m").exists(), sorted((out / "packages").rglob("*"))
    assert (out / ".ctxbuild" / "failed" / "packages" / "m" / "SM8650" / "m_ctx.onnx").is_file()


def _samples_tree(tree: Path, verify: Path, samples: int) -> None:
    keep_only(tree, "tiny_cnn_int8.yaml")
    recipe = tree / "tiny_cnn_int8.yaml"
    recipe.write_text(recipe.read_text() + f"verify: {{dir: {verify}, samples: {samples}}}\n")
    verify.mkdir()
    shutil.copy(sorted((tree / "models" / "calib" / "tiny_cnn").glob("*.npz"))[0], verify / "a.npz")


def test_a_fifo_among_the_samples_fails_the_build_naming_it(tree: Path, tmp_path: Path, ctxbuild) -> None:
    verify = tmp_path / "verify"
    _samples_tree(tree, verify, 4)
    _odd_entry(verify / "b.npz", "fifo", tmp_path)
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 1 and "Traceback" not in r.text, r.text
    assert f"sample {verify / 'b.npz'} is a FIFO" in r.err, r.err


def test_a_verification_on_fewer_samples_than_asked_says_so(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _samples_tree(tree, tmp_path / "verify", 3)
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 0, r.text
    assert "verify tiny_cnn_int8@SM8650: verified on 1 sample(s), fewer than the 3 asked for" in r.text, r.text


