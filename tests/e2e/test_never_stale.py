"""Never a stale or poisoned artifact (issue 19, items 1-3, 5): what OUT ships is what the inputs say now.

Each test builds the small fp16 MLP (no calibration) for one target with the real QNN EP, and compares
with a clean build of what the inputs are at the end: same bytes, or the build must fail.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from tests.conftest import keep_only, last_build
from tests.e2e.test_cache_build import digests

ONLY = ("--only", "mlp_fp16", "--target", "SM8650", "--no-verify")


def reweighted(src: Path, dst: Path, seed: int) -> None:
    """`src` with every float initializer redrawn: the same size on disk, other outputs (a retrained model)."""
    m = onnx.load(src)
    rng = np.random.default_rng(seed)
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(rng.standard_normal(a.shape).astype(np.float32), init.name))
    onnx.save(m, dst)


def clean_build(ctxbuild, tree: Path, out: Path) -> dict[str, str]:
    """A build into a fresh OUT with its own empty cache: what the inputs say now."""
    shutil.rmtree(out, ignore_errors=True)
    r = ctxbuild("build", str(tree), "-o", str(out), *ONLY, "--no-cache")
    assert r.code == 0, r.text
    return digests(out)


def test_retargeted_symlink_outside_the_tree_is_followed(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """`current.onnx -> v1.onnx` outside the recipe tree, retargeted to v2 (same size, an older mtime):
    the next build, and a build into a fresh OUT, ship v2's binary."""
    keep_only(tree, "mlp_fp16.yaml")
    models = tmp_path / "models"
    models.mkdir()
    reweighted(tree / "models" / "mlp.onnx", models / "v1.onnx", 1)
    reweighted(tree / "models" / "mlp.onnx", models / "v2.onnx", 2)
    assert (models / "v1.onnx").stat().st_size == (models / "v2.onnx").stat().st_size
    os.utime(models / "v2.onnx", (1_000_000, 1_000_000))  # a model copied with its old mtime (cp -p, rsync)
    (models / "current.onnx").symlink_to("v1.onnx")
    recipe = tree / "mlp_fp16.yaml"
    recipe.write_text(recipe.read_text().replace("models/mlp.onnx", str(models / "current.onnx")))
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), *ONLY)
    assert r.code == 0, r.text
    v1 = digests(out)

    (models / "current.onnx").unlink()
    (models / "current.onnx").symlink_to("v2.onnx")
    r = ctxbuild("build", str(tree), "-o", str(out), *ONLY)
    assert r.code == 0, r.text
    assert "ctxbuild: up to date" not in r.text
    after_retarget = digests(out)
    assert after_retarget != v1

    shutil.rmtree(out)  # a fresh OUT: the plan comes from the user cache, which must not be the v1 plan
    r = ctxbuild("build", str(tree), "-o", str(out), *ONLY)
    assert r.code == 0, r.text
    fresh = digests(out)
    assert fresh == after_retarget == clean_build(ctxbuild, tree, tmp_path / "clean")


def test_input_edited_while_its_action_runs_is_not_stored(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path,
                                                         monkeypatch, capsys) -> None:
    """The real prepare action runs in this process; the model is rewritten after it read it, before the
    runner stores the outputs. Nothing may be stored under the old content's key, nothing placed."""
    from ctxbuild.engine.run import runner
    from ctxbuild.plan import kinds
    from tests.conftest import plan_only, records

    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(cache_dir))
    plan_only([tree], out, verify=False)  # as the build with ONLY plans it
    spec = next((out / ".ctxbuild" / "actions").glob("prepare.*.json"))
    model = tree / "models" / "mlp.onnx"
    prepare = kinds.get("prepare").module()
    real_run = prepare.run

    def run_then_edit(ctx) -> None:
        real_run(ctx)
        reweighted(model, model, 7)  # the user saves a retrained model while the action runs

    monkeypatch.setattr(prepare, "run", run_then_edit)
    assert runner.main(str(spec)) == 1
    rec = next(r for r in records(out).values() if r["kind"] == "prepare")
    assert rec["status"] == "failed" and "changed while it ran" in rec["cause"], rec
    assert "mlp.onnx" in capsys.readouterr().err
    assert [p for p in cache_dir.glob("ac/*/*") if p.is_file()] == []  # nothing stored under any key
    monkeypatch.setattr(prepare, "run", real_run)
    # The next build keys the model as it is now and ships what a clean build of it ships.
    r = ctxbuild("build", str(tree), "-o", str(out), *ONLY)
    assert r.code == 0, r.text
    assert digests(out) == clean_build(ctxbuild, tree, tmp_path / "clean")


def test_output_edited_in_out_is_restored_not_adopted(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """A byte flipped in a shipped binary (newer mtime: ninja sees it up to date) is put back from the cache;
    the manifest lists the bytes the action made."""
    import json

    keep_only(tree, "tiny_cnn_int8.yaml")
    out = tmp_path / "out"
    args = ("--only", "tiny_cnn_int8", "--target", "SM8650")
    r = ctxbuild("build", str(tree), "-o", str(out), *args)
    assert r.code == 0, r.text
    built = digests(out)
    binary = next(out.glob("SM8650/*/*.bin"))
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF
    binary.unlink()  # a new file: the old one is a read-only hard link into the cache (docs/caching.md)
    binary.write_bytes(bytes(data))
    r = ctxbuild("build", str(tree), "-o", str(out), *args)
    assert r.code == 0, r.text
    assert digests(out) == built
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {a["path"]: a["sha256"] for a in manifest["artifacts"]}
    assert listed[str(binary.relative_to(out))] == built[str(binary.relative_to(out))]
    assert last_build(out)  # the edge ran again (restored from the cache)


def test_adapter_renamed_to_another_format_fails_cached_or_clean(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """The suffix picks the adapter's reader, so it is part of the key: safetensors bytes named .npz fail the
    same whether the cache holds the .safetensors build or not."""
    keep_only(tree, "lora_mlp.yaml")
    out = tmp_path / "out"
    args = ("--only", "lora_mlp", "--target", "SM8650", "--no-verify")
    r = ctxbuild("build", str(tree), "-o", str(out), *args)
    assert r.code == 0, r.text
    adapters = tree / "models" / "adapters"
    (adapters / "formal.npz").write_bytes((adapters / "formal.safetensors").read_bytes())
    recipe = tree / "lora_mlp.yaml"
    recipe.write_text(recipe.read_text().replace("formal.safetensors", "formal.npz"))
    cached = ctxbuild("build", str(tree), "-o", str(out), *args)
    clean = ctxbuild("build", str(tree), "-o", str(tmp_path / "clean"), *args, "--no-cache")
    assert clean.code == 1, clean.text
    assert cached.code == 1, cached.text
