"""The fast paths of issue #11, through real builds: a no-op that runs no worker and rewrites nothing, and a
fresh OUT restored from the cache before ninja starts, after which ninja itself finds nothing to do."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from ctxbuild.engine.fast import plancache
from ctxbuild.engine.ninja import ninja_binary
from ctxbuild.engine.ninjalog import rapidhash
from tests.conftest import last_build, records
from tests.e2e.test_cache_build import build, digests, explain_lines

RECIPE = "tiny_cnn_int8"  # prepare, quantize, compile, verify: every kind of edge a fresh OUT restores


def output_digests(out: Path) -> list[str]:
    return sorted(o["sha256"] for rec in records(out).values() for o in rec["outputs"].values())


def ninja_dry_run(out: Path) -> str:
    """What the PyPI ninja itself (not ctxbuild) would do for RECIPE in OUT, with its reasons."""
    p = subprocess.run([ninja_binary(), "-n", "-d", "explain", f"recipe/{RECIPE}"], cwd=out, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout + p.stderr


def test_fresh_out_restore_then_build_runs_nothing(tree: Path, tmp_path: Path, ctxbuild) -> None:
    first = tmp_path / "first"
    build(ctxbuild, tree, first, "--only", RECIPE)
    assert set(last_build(first).values()) == {"run"}

    out = tmp_path / "fresh"
    r = build(ctxbuild, tree, out, "--only", RECIPE, "--explain")
    ran = last_build(out)
    assert len(ran) == 4 and set(ran.values()) == {"cache"}, ran
    assert "restored 4 of 4 pending actions" in r.out, r.out
    assert all(why.startswith("restored from cache") for why in explain_lines(r.out).values()), r.out
    assert not (out / ".ctxbuild" / "worker.log").exists()  # nothing ran, so no worker was started
    assert digests(out) == digests(first)
    assert output_digests(out) == output_digests(first)  # intermediate models too
    assert "no work to do" in ninja_dry_run(out)  # ninja's own view: restored edges are up to date

    r = build(ctxbuild, tree, out, "--only", RECIPE)
    assert "ctxbuild: up to date" in r.out and last_build(out) == {}


def test_partial_cache_restores_what_it_can_and_runs_the_rest(tree: Path, tmp_path: Path, ctxbuild,
                                                                 cache_dir: Path) -> None:
    first = tmp_path / "first"
    build(ctxbuild, tree, first, "--only", RECIPE)
    compile_id = f"compile/{RECIPE}@SM8650"
    key = records(first)[compile_id]["key"]
    (cache_dir / "ac" / key[:2] / key).unlink()  # the cache lost the compile

    out = tmp_path / "fresh"
    build(ctxbuild, tree, out, "--only", RECIPE)
    ran = last_build(out)
    # prepare and quantize restored up front; the compile runs; verify, downstream of it, goes through ninja
    assert ran[compile_id] == "run" and ran[f"verify/{RECIPE}@SM8650"] == "cache", ran
    assert sorted(v for k, v in ran.items() if k.split("/")[0] in ("prepare", "quantize")) == ["cache", "cache"]
    assert (out / ".ctxbuild" / "worker.log").exists()
    assert digests(out) == digests(first)
    assert "no work to do" in ninja_dry_run(out)
    r = build(ctxbuild, tree, out, "--only", RECIPE)
    assert "ctxbuild: up to date" in r.out and last_build(out) == {}


def test_noop_rewrites_no_summary_unless_records_changed(tree: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    build(ctxbuild, tree, out, "--only", RECIPE)
    summaries = [out / "manifest.json", out / "report.json", out / "report.html"]
    stamps = [p.stat().st_mtime_ns for p in summaries]
    r = build(ctxbuild, tree, out, "--only", RECIPE)
    assert "ctxbuild: up to date" in r.out
    assert [p.stat().st_mtime_ns for p in summaries] == stamps
    # A build interrupted after its actions but before its summaries leaves records newer than them:
    # the next no-op writes the summaries.
    (out / "report.html").unlink()
    rec = next((out / ".ctxbuild" / "records").glob("compile.*"))
    rec.write_bytes(rec.read_bytes())
    r = build(ctxbuild, tree, out, "--only", RECIPE)
    assert "ctxbuild: up to date" in r.out and (out / "report.html").is_file()


def test_build_log_hash_is_ninjas(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """Every entry ninja itself wrote carries the hash ninjalog computes for that edge's command."""
    out = tmp_path / "out"
    build(ctxbuild, tree, out, "--only", RECIPE, "--no-cache")  # ninja runs (and logs) every edge
    lines = (out / ".ctxbuild" / ".ninja_log").read_text().splitlines()
    assert lines[0] == "# ninja log v7"
    checked = 0
    for line in lines[1:]:
        _, _, _, output, digest = line.split("\t")
        command = subprocess.run([ninja_binary(), "-t", "commands", "-s", output], cwd=out, capture_output=True,
                                 text=True, check=True).stdout.rstrip("\n")
        assert int(digest, 16) == rapidhash(command.encode()), output
        checked += 1
    assert checked >= 5


def test_rapidhash_reference_values() -> None:
    """Short inputs take other branches than commands do. Expected values: ninja 1.13.2's
    src/third_party/rapidhash/rapidhash.h compiled with gcc on x86_64."""
    fox = b"the quick brown fox jumps over the lazy dog, twice over: the quick brown fox jumps over the lazy dog!!"
    cases = {b"": 0x5A6EF77074EBC84B, b"a": 0xC11328477BC0F5D1, b"abc": 0x347080FBF5FCD81,
             b"abcd": 0x56B66B8DC802BCC, b"0123456789abcdef": 0xFCC8FA4E2771D2EF,
             b"0123456789abcdefg": 0xAB3C2320D701D807, fox: 0xF7DE5CEDF7BDF329}
    assert {s: rapidhash(s) for s in cases} == cases


def imported(stderr: str) -> set[str]:
    """Modules a process imported, from its PYTHONPROFILEIMPORTTIME lines."""
    return {line.rpartition("|")[2].strip() for line in stderr.splitlines() if line.startswith("import time:")}


HEAVY = {"networkx", "jsonschema", "onnx", "numpy", "onnxruntime", "jinja2"}


def test_plan_cache_and_light_fast_paths(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """A fresh OUT at a path planned before takes its plan from the cache and restores without importing the
    planner's libraries, onnx or numpy; a no-op imports none of them either (nor jinja2: no report)."""
    out = tmp_path / "out"
    build(ctxbuild, tree, out, "--only", RECIPE)
    profile = {"PYTHONPROFILEIMPORTTIME": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    r = build(ctxbuild, tree, out, "--only", RECIPE, env=profile)
    assert "ctxbuild: up to date" in r.out
    assert not imported(r.err) & HEAVY, imported(r.err) & HEAVY

    shutil.rmtree(out)
    r = build(ctxbuild, tree, out, "--only", RECIPE, env=profile)
    assert set(last_build(out).values()) == {"cache"}
    assert not imported(r.err) & (HEAVY - {"jinja2"}), imported(r.err) & HEAVY  # jinja2: the new report
    light = {"yaml", "importlib.metadata", "ctxbuild.engine.farm.gateway", "ctxbuild.recipes.adapters"}  # ~40 ms of a 0.25 s restore
    assert not imported(r.err) & light, imported(r.err) & light

    # A recipe edited since: the cached plan no longer matches, the planner runs and sees the edit.
    shutil.rmtree(out)
    recipe = tree / f"{RECIPE}.yaml"
    recipe.write_text(recipe.read_text().replace("SM8650", "SM8750"))
    r = build(ctxbuild, tree, out, "--only", RECIPE, env=profile)
    assert "networkx" in imported(r.err)
    assert (out / "SM8750" / RECIPE).is_dir() and not (out / "SM8650").exists()


def test_plan_cache_keeps_the_most_recently_used_entries(tmp_path: Path) -> None:
    for i in range(plancache.KEEP + 8):
        entry = tmp_path / f"{i:02d}.json"
        entry.write_text("{}")
        os.utime(entry, (1000 + i, 1000 + i))
    plancache._prune(tmp_path)
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == [f"{i:02d}" for i in range(8, plancache.KEEP + 8)]


def test_plan_cache_fingerprint_reads_recipes_by_content_and_qnn_libraries_by_stat(tmp_path: Path) -> None:
    recipes, lib = tmp_path / "recipes", tmp_path / "libQnnHtp.so"
    recipes.mkdir()
    (recipes / "a.yaml").write_text("model: m.onnx\n")
    lib.write_bytes(b"\0" * 64)
    plan = json.dumps({"generator_deps": [str(recipes), str(recipes / "a.yaml"), str(lib)],
                       "toolchain_deps": [str(lib)]})
    first = plancache._fingerprint(tmp_path / "out", plan, {})
    os.utime(recipes / "a.yaml", ns=(1, 1))  # a checkout's new mtime, same content: the same plan
    assert plancache._fingerprint(tmp_path / "out", plan, {}) == first
    (recipes / "a.yaml").write_text("model: n.onnx\n")
    edited = plancache._fingerprint(tmp_path / "out", plan, {})
    assert edited != first
    st = lib.stat()
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # pip's new library: never hashed, its stat differs
    assert plancache._fingerprint(tmp_path / "out", plan, {}) != edited
