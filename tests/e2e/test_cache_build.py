"""The action cache seen through real builds of the example recipes: what reruns, what restores, and why.

Every build here runs ninja, the worker and the real QNN EP; recipes are narrowed with --only to keep
each test to a few seconds.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from ctxbuild.units import parse_size
from ctxbuild.errors import UsageError
from tests.conftest import ROOT, cache_entries, last_build, records

COMPILE_KINDS = ("compile", "bundle")


def outputs(out: Path) -> dict[str, tuple[str, int]]:
    """Every artifact under OUT (not the state dir): relative path -> (sha256, mtime_ns)."""
    found = {}
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out)
        if p.is_file() and rel.parts[0] != ".ctxbuild" and len(rel.parts) > 1:
            found[str(rel)] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return found


def digests(out: Path) -> dict[str, str]:
    return {k: v[0] for k, v in outputs(out).items()}


def kinds(out: Path, ids) -> set[str]:
    recs = records(out)
    return {recs[i]["kind"] for i in ids}


def explain_lines(text: str) -> dict[str, str]:
    lines = {}
    for line in text.splitlines():
        if line.startswith("explain: "):
            action, _, why = line[len("explain: "):].partition(": ")
            lines[action] = why
    return lines


def build(ctxbuild, tree: Path, out: Path, *args: str, env: dict[str, str] | None = None):
    r = ctxbuild("build", str(tree), "-o", str(out), *args, env=env)
    assert r.code == 0, r.text
    return r


def other_tiny_cnn(path: Path) -> None:
    """The example CNN with different weights (the project's own generator, another seed)."""
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "recipes" / "models" / "make_models.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    onnx.save(mod.tiny_cnn(np.random.default_rng(99)), path)


def test_touching_a_model_rebuilds_nothing(tree: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    build(ctxbuild, tree, out, "--only", "tiny_cnn_int8")
    before = outputs(out)
    keys = {i: r["key"] for i, r in records(out).items()}
    model = tree / "models" / "tiny_cnn.onnx"
    time.sleep(0.01)
    os.utime(model)  # `touch`: mtime now, content unchanged
    r = build(ctxbuild, tree, out, "--only", "tiny_cnn_int8", "--explain")
    ran = last_build(out)
    assert ran and kinds(out, ran) == {"prepare"}, ran  # ninja reruns prepare; restat stops it there
    for action_id in ran:
        assert records(out)[action_id]["key"] == keys[action_id]
        assert "key unchanged" in explain_lines(r.out)[action_id], r.out
    assert outputs(out) == before  # not rewritten: same bytes, same mtimes
    r = build(ctxbuild, tree, out, "--only", "tiny_cnn_int8")
    assert "ctxbuild: up to date" in r.text and last_build(out) == {}


def test_reverting_a_model_restores_from_cache(tree: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    model = tree / "models" / "tiny_cnn.onnx"
    original = model.read_bytes()
    build(ctxbuild, tree, out, "--only", "tiny_cnn_int8")
    first = digests(out)
    other_tiny_cnn(model)
    r = build(ctxbuild, tree, out, "--only", "tiny_cnn_int8", "--explain")
    ran = last_build(out)
    assert ran["compile/tiny_cnn_int8@SM8650"] == "run"
    assert "ran: not in cache; changed: inputs (model, model.data)" in explain_lines(r.out)["compile/tiny_cnn_int8@SM8650"]
    assert digests(out) != first
    model.write_bytes(original)
    r = build(ctxbuild, tree, out, "--only", "tiny_cnn_int8", "--explain")
    ran = last_build(out)
    assert ran["compile/tiny_cnn_int8@SM8650"] == "cache", ran
    assert set(ran.values()) == {"cache"}, ran  # prepare and quantize too: nothing executed
    assert explain_lines(r.out)["compile/tiny_cnn_int8@SM8650"].startswith("restored from cache; changed: inputs")
    assert digests(out) == first


def test_changing_one_targets_option_rebuilds_only_its_compile(tree: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    build(ctxbuild, tree, out, "--only", "tiny_cnn", "--only", "tiny_cnn_int8")
    before = outputs(out)
    # One target of a three-target recipe, given as an explicit dict with a different VTCM size.
    recipe = tree / "tiny_cnn.yaml"
    recipe.write_text(recipe.read_text().replace(
        "targets: [phones, laptops]", "targets: [phones, {name: SC8380XP, soc_model: 60, htp_arch: 73, vtcm_mb: 4}]"))
    r = build(ctxbuild, tree, out, "--only", "tiny_cnn", "--only", "tiny_cnn_int8", "--explain")
    ran = last_build(out)
    compiled = {i for i in ran if records(out)[i]["kind"] in COMPILE_KINDS}
    assert compiled == {"compile/tiny_cnn@SC8380XP"}, ran
    assert ran["compile/tiny_cnn@SC8380XP"] == "run"
    assert all(i.endswith("@SC8380XP") for i in ran), ran  # its verify at most, nothing upstream
    assert explain_lines(r.out)["compile/tiny_cnn@SC8380XP"] == \
        "ran: not in cache; changed: params (provider_options.vtcm_mb)", r.out
    after = outputs(out)
    for path, (digest, mtime) in before.items():
        if not path.startswith("SC8380XP/tiny_cnn/"):
            assert after[path] == (digest, mtime), path
    # A recipe with one target: `compile: {vtcm_mb: 4}` rebuilds that one compile only.
    recipe = tree / "tiny_cnn_int8.yaml"
    recipe.write_text(recipe.read_text() + "compile:\n  vtcm_mb: 4\n")
    build(ctxbuild, tree, out, "--only", "tiny_cnn", "--only", "tiny_cnn_int8")
    ran = last_build(out)
    assert {i for i in ran if records(out)[i]["kind"] in COMPILE_KINDS} == {"compile/tiny_cnn_int8@SM8650"}, ran


@pytest.fixture
def fake_qnn_version(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH under which importlib.metadata reports onnxruntime-qnn 9.9.9 while the real package (and
    its libraries) load: a dist-info of our own beside a symlink to the installed package."""
    import onnxruntime_qnn

    from ctxbuild.toolchain import installed as toolchain

    d = tmp_path / "fake-qnn"
    info = d / "onnxruntime_qnn-9.9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-qnn\nVersion: 9.9.9\n")
    (d / "onnxruntime_qnn").symlink_to(Path(onnxruntime_qnn.__file__).resolve().parent)
    env = {"PYTHONPATH": os.pathsep.join([str(d), *filter(None, [os.environ.get("PYTHONPATH")])])}
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", "from ctxbuild.toolchain import installed as t; import json; "
                            "print(json.dumps([t.version('onnxruntime-qnn'), str(t.qnn_library_dir()), "
                            "[f.is_file() for f in t.library_files()]]))"],
                           env={**os.environ, **env}, capture_output=True, text=True, check=True)
    version, libdir, present = json.loads(probe.stdout)
    assert version == "9.9.9" and Path(libdir).resolve() == toolchain.qnn_library_dir().resolve() and all(present)
    return env


def test_new_qnn_version_invalidates_compiles_only(tree: Path, tmp_path: Path, ctxbuild, fake_qnn_version) -> None:
    out = tmp_path / "out"
    only = ("--only", "tiny_cnn", "--only", "mlp_fp16")
    build(ctxbuild, tree, out, *only)
    real = records(out)["compile/tiny_cnn@SM8650"]["key_detail"]["toolchain"]["onnxruntime-qnn"]
    r = build(ctxbuild, tree, out, *only, "--explain", env=fake_qnn_version)
    ran = last_build(out)
    recs = records(out)
    compiles = {i for i, r_ in recs.items() if r_["kind"] in COMPILE_KINDS}
    assert compiles and compiles <= set(ran), ran
    assert all(ran[i] == "run" for i in compiles), ran
    assert not any(recs[i]["kind"] in ("prepare", "quantize") and ran[i] == "run" for i in ran), ran
    why = explain_lines(r.out)["compile/tiny_cnn@SM8650"]
    assert why == f"ran: not in cache; changed: toolchain (onnxruntime-qnn {real} -> 9.9.9)", r.out
    assert json.loads((out / "manifest.json").read_text())["toolchain"]["onnxruntime-qnn"] == "9.9.9"
    # Back on the installed version: every compile comes back from the cache.
    r = build(ctxbuild, tree, out, *only, "--explain")
    ran = last_build(out)
    assert all(ran[i] == "cache" for i in compiles), ran
    assert f"toolchain (onnxruntime-qnn 9.9.9 -> {real})" in explain_lines(r.out)["compile/tiny_cnn@SM8650"]


def test_fresh_out_restores_everything_byte_identical(tree: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    only = ("--only", "tiny_cnn", "--only", "mlp_fp16")
    build(ctxbuild, tree, out, *only)
    first = digests(out)
    manifest = json.loads((out / "manifest.json").read_text())
    shutil.rmtree(out)
    r = build(ctxbuild, tree, out, *only, "--explain")
    ran = last_build(out)
    assert ran and set(ran.values()) == {"cache"}, ran
    assert not any("ran:" in w for w in explain_lines(r.out).values())
    assert all(w == "restored from cache; no earlier build in this output directory"
               for w in explain_lines(r.out).values()), r.out
    assert digests(out) == first
    assert json.loads((out / "manifest.json").read_text())["artifacts"] == manifest["artifacts"]
    for a in manifest["artifacts"]:
        if a["path"].endswith(".onnx"):
            onnx.load(out / a["path"], load_external_data=False)


def test_no_cache_bypasses_the_cache(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    out = tmp_path / "out"
    build(ctxbuild, tree, out, "--only", "mlp_fp16", "--no-cache")
    assert not (cache_dir / "ac").exists() and not (cache_dir / "cas").exists()  # (the toolchain memo may be)
    assert set(last_build(out).values()) == {"run"}
    build(ctxbuild, tree, out, "--only", "mlp_fp16")  # no-op: nothing stale, nothing stored
    build(ctxbuild, tree, tmp_path / "out2", "--only", "mlp_fp16")  # fills the cache
    stats = json.loads(ctxbuild("cache", "stats", "--json").out)
    shutil.rmtree(out)
    r = build(ctxbuild, tree, out, "--only", "mlp_fp16", "--no-cache", "--explain")
    ran = last_build(out)
    assert ran and set(ran.values()) == {"run"}, ran  # a warm cache, not used
    assert all(w.startswith("ran: cache disabled") for w in explain_lines(r.out).values()), r.out
    after = json.loads(ctxbuild("cache", "stats", "--json").out)
    assert (after["entries"], after["blobs"], after["bytes"]) == (stats["entries"], stats["blobs"], stats["bytes"])
    assert after["last_build"]["out"] == str((tmp_path / "out2").resolve())  # a --no-cache build is not recorded


def test_cache_stats_gc_clear(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    r = ctxbuild("cache", "stats", "--json")
    assert r.code == 0, r.text
    assert json.loads(r.out)["entries"] == 0 and json.loads(r.out)["last_build"] is None
    build(ctxbuild, tree, tmp_path / "a", "--only", "mlp_fp16")
    time.sleep(0.05)
    build(ctxbuild, tree, tmp_path / "b", "--only", "tiny_cnn_int8")
    stats = json.loads(ctxbuild("cache", "stats", "--json").out)
    n = cache_entries(tmp_path / "a", tmp_path / "b")
    assert stats["entries"] == n and stats["blobs"] >= n and stats["bytes"] > 0
    assert stats["last_build"]["misses"] == len(records(tmp_path / "b")) and stats["last_build"]["hits"] == 0
    build(ctxbuild, tree, tmp_path / "b2", "--only", "tiny_cnn_int8")
    build(ctxbuild, tree, tmp_path / "a", "--only", "mlp_fp16")  # a no-op: does not replace the figures
    r = ctxbuild("cache", "stats")
    assert r.code == 0 and f"entries           {n}" in r.out, r.out
    ran = len(records(tmp_path / "b2"))
    assert f"{ran} hits (100% hits) ({ran} local, 0 remote), 0 misses" in r.out, r.out
    # Same numbers with --cache-dir and no environment variable.
    r = ctxbuild("cache", "stats", "--json", "--cache-dir", str(cache_dir), env={"CTXBUILD_CACHE_DIR": ""})
    assert json.loads(r.out)["entries"] == n

    # gc to just under the total: the least recently used entries (the mlp build's) go first.
    keys_a = {r_["key"] for r_ in records(tmp_path / "a").values()}
    r = ctxbuild("cache", "gc", "--max-size", str(stats["bytes"] - 1))
    assert r.code == 0 and r.out.startswith("removed "), r.text
    left = {p.name for p in (cache_dir / "ac").rglob("*") if p.is_file()}
    assert len(left) < n and keys_a - left, (keys_a, left)  # some of the oldest build's entries went
    assert {r_["key"] for r_ in records(tmp_path / "b").values()} <= left, "newest entries were evicted"
    r = ctxbuild("cache", "gc", "--max-size", "2G")
    assert r.code == 0 and r.out.startswith("removed 0 entries and 0 blobs"), r.out
    r = ctxbuild("cache", "gc", "--max-size", "0")
    after = json.loads(ctxbuild("cache", "stats", "--json").out)
    assert after["entries"] == 0, r.out
    # Blobs no record names any more but written minutes ago may belong to a build in progress: kept, and said so.
    assert after["bytes"] == 0 or "were kept" in r.out, r.out

    for bad in ("lots", "5X", "-1", "1.2.3"):
        r = ctxbuild("cache", "gc", "--max-size", bad)
        assert r.code == 2 and r.out == "" and len(r.err.strip().splitlines()) == 1, (bad, r.text)
        assert "bad size" in r.err
    r = ctxbuild("cache", "gc")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.text

    build(ctxbuild, tree, tmp_path / "c", "--only", "mlp_fp16")
    assert {p.name for p in (cache_dir / "memo").iterdir()} >= {"plans", "binary-facts"}
    r = ctxbuild("cache", "clear")
    assert r.code == 0 and r.out.startswith("removed "), r.text
    assert not (cache_dir / "memo").exists()  # derived facts (plans, SoCs read...) go too
    after = json.loads(ctxbuild("cache", "stats", "--json").out)
    assert (after["entries"], after["blobs"], after["last_build"]) == (0, 0, None)


@pytest.mark.parametrize("text,expected", [("123", 123), ("500M", 500 * 10**6), ("2G", 2 * 10**9), ("2g", 2 * 10**9),
                                           ("1.5GiB", int(1.5 * 2**30)), ("64Ki", 65536), ("10MB", 10**7)])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_rejects_garbage() -> None:
    with pytest.raises(UsageError):
        parse_size("big")
