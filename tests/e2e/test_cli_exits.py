"""How the CLI ends (issue 33): one JSON document on every exit under --json, a dry run that writes nothing, and
no process of the build left behind after a Ctrl-C. (A second `clean`: tests/e2e/test_safety.py.)"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
    assert r.code == 0 and r.out == "ctxbuild: up to date, nothing would run\n", r.text
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


def _build_processes(out: Path) -> list[int]:
    """The build's worker and the action processes it forked (and theirs): `ctxbuild worker` by their command
    line, this OUT's by the worker's log (its stdout) or the actions' working directory."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and b"ctxbuild\0worker\0" in (proc / "cmdline").read_bytes()
                    and (os.readlink(proc / "fd" / "1") == str(out / ".ctxbuild" / "worker.log")
                         or os.readlink(proc / "cwd") == str(out))):
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _forked_by_an_action(out: Path) -> bool:
    """An action's own child runs (a compile or the simulator, forked for crash isolation)."""
    pids = set(_build_processes(out))
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(stat[1]) in pids and os.readlink(f"/proc/{stat[1]}/cwd") == str(out):
            return True
    return False


def _verifying_build(tmp_path: Path, cache_dir: Path, *args: str, **popen: Any) -> tuple[subprocess.Popen, Path]:
    """A build of a 128 MB fp16 chain started in the background, returned once its verify action runs the simulator
    in a child of its own (the process tree an interrupt or a kill meets)."""
    from tests._big_models import matmul_chain

    tree = tmp_path / "recipes"
    tree.mkdir()
    matmul_chain(tree / "chain.onnx", dim=2048, layers=8, precision="fp16")
    (tree / "chain.yaml").write_text("model: chain.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    out = tmp_path / "out"
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache_dir)}
    env.pop("MAKEFLAGS", None)
    driver = subprocess.Popen([sys.executable, "-m", "ctxbuild", "build", str(tree), "-o", str(out), *args],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    compiled = out / ".ctxbuild" / "records" / "compile.chain@SM8650.json"
    deadline = time.monotonic() + 300
    while not (compiled.exists() and _forked_by_an_action(out)):  # the simulator runs in the verify's child
        if driver.poll() is not None or time.monotonic() > deadline:
            driver.kill()
            pytest.fail(f"the build did not reach verification: {driver.communicate()}")
        time.sleep(0.05)
    return driver, out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_ends_the_worker_and_what_its_actions_forked(tmp_path: Path, cache_dir: Path, sig: int) -> None:
    """Issue 33: a worker outlived Ctrl-C by 5-10 s. The worker's action processes were killed, but a compile
    or simulator run they had forked finished first (seen: 2-3.5 s for this 128 MB model). The signal to the
    driver while the simulator verifies: Ctrl-C exits 130 with --json's document, SIGTERM the same way and then
    dies by SIGTERM, what was compiled but not verified is set aside, and nothing of the build is left a second
    later."""
    driver, out = _verifying_build(tmp_path, cache_dir, "--json", start_new_session=True)
    try:
        driver.send_signal(sig)
        stdout, stderr = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    # Ctrl-C exits 130; SIGTERM ends it by SIGTERM once it has cleaned up (a CI job cancelled), --json saying 143
    word, code = ("interrupted", 130) if sig == signal.SIGINT else ("terminated", 143)
    assert driver.returncode == (130 if sig == signal.SIGINT else -signal.SIGTERM), stderr
    assert json.loads(stdout)["error"]["message"] == word and json.loads(stdout)["exit_code"] == code, stdout
    # compiled, not verified: out of the deliverable tree, as after a failure (it stayed in OUT/SM8650/)
    assert not (out / "SM8650").exists() and (out / ".ctxbuild" / "failed" / "SM8650" / "chain").is_dir(), stderr
    assert "not verified in this build" in stderr, stderr
    deadline = time.monotonic() + 1.0
    while (left := _build_processes(out)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"still running a second after the build ended: {left}"


def test_a_killed_action_is_a_failed_action_with_its_record(tmp_path: Path, cache_dir: Path) -> None:
    """#30: an action process killed by a signal (here SIGKILL, as the OOM killer sends it, while the simulator
    verifies) wrote no record: the build said "ninja failed before running an action" and "0 failed". Now the
    fork server writes its failed record: the build names the action, the signal and its log."""
    driver, out = _verifying_build(tmp_path, cache_dir)
    try:
        pids = set(_build_processes(out))
        parents = {p: int(Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()[1]) for p in pids}
        (action,) = [p for p, parent in parents.items() if parent in pids and parents[parent] not in pids]
        os.kill(action, signal.SIGKILL)
        stdout, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 1, stderr
    assert "ctxbuild: FAILED verify/chain@SM8650: the action process was killed by SIGKILL" in stderr, stderr
    assert "ninja failed before running an action" not in stderr and ", 1 failed" in stdout, stdout
    record = json.loads((out / ".ctxbuild" / "records" / "verify.chain@SM8650.json").read_text())
    assert record["status"] == "failed" and record["signal"] == "SIGKILL" and (out / record["log"]).is_file()
