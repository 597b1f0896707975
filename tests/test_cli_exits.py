"""How the CLI ends (issue 33): one JSON document on every exit under --json, a dry run that writes nothing, and
no process of the build left behind after a Ctrl-C. (A second `clean`: tests/test_safety.py.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import keep_only


def _json(r) -> dict:
    """stdout is exactly one JSON document (progress and the error line go to stderr)."""
    doc = json.loads(r.out)
    assert doc["exit_code"] == r.code, (doc, r.err)
    return doc


def test_json_on_a_recipe_error(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    bad = tree / "bad.yaml"
    bad.write_text("model: models/mlp.onnx\nprecision: fp16\ntargets: [SM8650]\nverify: {samples: 4, bogus: 1}\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "--json")
    assert r.code == 2, r.text
    assert _json(r) == {"ok": False, "exit_code": 2, "error": {
        "file": str(bad), "line": 4, "message": "verify: unknown key 'bogus'",
        "hint": "known keys: dir, enabled, min_cosine, min_snr_db, samples, slices, timeout_s"}}
    assert r.err.startswith(f"ctxbuild: error: {bad}:4: verify: unknown key 'bogus'"), r.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["build", "-k", "-3", "--json"], "build: argument -k/--keep-going: must be 0 or more, got -3"),
    (["build", "nowhere.yaml", "--json"], "no such file or directory"),
    (["build", "--json", "--only", "nope"], "--only nope: no such recipe"),
    (["inspect", "--json", "missing.bin"], "missing.bin"),
    (["check", "--json", "out", "--runtime", "qairt=0.1"], "qairt"),
    (["cache", "stats", "--json", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_json_on_every_usage_error(tree: Path, ctxbuild, args: list[str], message: str) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    r = ctxbuild(*args, cwd=tree.parent)
    assert r.code in (1, 2), r.text
    doc = _json(r)
    assert doc["ok"] is False and message in doc["error"]["message"], doc
    assert set(doc["error"]) == {"file", "line", "message", "hint"}


def test_json_on_a_failed_build_and_on_success(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    (tree / "strict.yaml").write_text("model: models/mlp.onnx\nprecision: fp16\ntargets: [SM8650]\n"
                                      "verify: {dir: models/calib/mlp, min_snr_db: 120}\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650", "-k", "0", "--json")
    assert r.code == 1, r.text
    doc = _json(r)
    assert doc["ok"] is False and doc["error"] is None and doc["actions"]["failed"] == 1, doc
    assert [f["id"] for f in doc["failures"]] == ["verify/strict@SM8650"], doc
    assert {(a["recipe"], a["passed"]) for a in doc["accuracy"] if a["target"] == "SM8650"} == {("mlp_fp16", True),
                                                                                              ("strict", False)}
    r = ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650", "--only", "mlp_fp16", "--json")
    assert r.code == 0, r.text
    doc = _json(r)
    assert doc["ok"] is True and doc["error"] is None and doc["failures"] == [], doc


def test_json_from_verify_layers(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """`verify --layers --json`: the diagnoses as one document (was the text report on stdout)."""
    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "mlp_fp16", "--target", "SM8650", str(tree), "-o", str(out), "--json")
    assert r.code == 0, r.text
    doc = _json(r)
    [diagnosis] = doc["diagnoses"]
    written = out / "SM8650" / "mlp_fp16" / "mlp_fp16_layers.json"
    assert diagnosis.pop("written") == str(written) and diagnosis == json.loads(written.read_text())
    assert diagnosis["where"] == "htp" and "compile mlp_fp16@SM8650" in r.err  # progress on stderr


def _snapshot(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in sorted(out.rglob("*"))}


def test_dry_run_of_a_built_out_writes_nothing(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """OUT's plan current: ninja's answer, and the directories ninja -n makes for what it would run are gone
    again. Recipes changed since: the new plan in memory, build.ninja untouched."""
    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    only = ("--target", "SM8650", "--no-verify")
    r = ctxbuild("build", str(tree), "-o", str(out), *only)
    assert r.code == 0, r.text
    r = ctxbuild("build", str(tree), "-o", str(out), *only, "-n")
    assert r.code == 0 and r.out == "ninja: no work to do.\n", r.text
    shutil.rmtree(out / "SM8650")
    before = _snapshot(out)
    r = ctxbuild("build", str(tree), "-o", str(out), *only, "-n", "--json")
    assert r.code == 0, r.text
    assert [a["id"] for a in _json(r)["would_run"]] == ["compile/mlp_fp16@SM8650"]
    assert r.err == "[1/1] compile mlp_fp16@SM8650\n"
    assert _snapshot(out) == before  # ninja made OUT/SM8650/mlp_fp16/ for it; removed again
    (tree / "mlp_fp16.yaml").write_text((tree / "mlp_fp16.yaml").read_text() + "# edited: OUT's plan is stale\n")
    r = ctxbuild("build", str(tree), "-o", str(out), *only, "-n")
    assert r.code == 0 and r.out.splitlines()[-1] == "[2/2] compile mlp_fp16@SM8650", r.text
    assert _snapshot(out) == before
