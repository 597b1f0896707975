"""Selectable toolchains: choosing a published onnxruntime-qnn release by version or by the devices' runtime,
recipe variants per toolchain, and one recipe built end to end with the installed toolchain and with
onnxruntime-qnn 2.3.0 (QAIRT 2.47) provisioned on demand; the 2.3.0 artifact then loads and runs in a separate
onnxruntime 1.24.4 + onnxruntime-qnn 2.3.0 runtime, the installed one's does not, as the gate said."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxbuild.errors import UsageError
from ctxbuild.toolchain.choose import Toolchain, choose
from tests._old_runtime import load, old_runtime_python
from tests.conftest import keep_only, records

INSTALLED = "2.7.0"  # constraints.txt's onnxruntime-qnn


@pytest.mark.parametrize("spec, plugin", [
    ({"qairt": "2.47"}, "2.3.0"), ({"qairt": "2.47.0"}, "2.3.0"),
    ({"qairt": "2.48.3"}, "2.3.0"),  # 2.4.0 ships 2.48.40: newer than the devices' 2.48.3
    ({"qairt": "2.49"}, "2.5.0"), ({"qairt": "2.50.40"}, "2.6.0"),
    ({"onnxruntime-qnn": "2.4.0"}, "2.4.0"), ("2.3.0", "2.3.0"),
    ({"qairt": "2.51"}, None), ({"qairt": "2.60"}, None), ("2.7.0", None), ("installed", None),
])
def test_choose_the_newest_release_not_newer_than_the_runtime(spec: object, plugin: str | None) -> None:
    got = choose(spec, "r.yaml:3: toolchain", INSTALLED)
    assert (got.plugin if got else None) == plugin


@pytest.mark.parametrize("spec, says", [
    ({"qairt": "2.46"}, "older than the oldest onnxruntime-qnn release"),
    ("9.9.9", "onnxruntime-qnn 9.9.9 is not a published release"),
    ({"qairt": "2.47", "onnxruntime-qnn": "2.5.0"}, "onnxruntime-qnn 2.5.0 ships QAIRT 2.49.40, not 2.47"),
])
def test_what_no_release_serves_is_a_usage_error(spec: object, says: str) -> None:
    with pytest.raises(UsageError, match=says) as e:
        choose(spec, "r.yaml:3: toolchain", INSTALLED)
    assert str(e.value.message).startswith("r.yaml:3: toolchain")


def test_a_toolchain_names_its_pins() -> None:
    tc = Toolchain("2.3.0")
    assert tc.name == "onnxruntime-qnn-2.3.0" and tc.qairt == "2.47.0" and tc.suffix == "qairt-2.47.0"
    assert tc.pins == ["onnxruntime==1.24.4", "onnxruntime-qnn==2.3.0"]


RECIPE = """model: models/tiny_cnn.onnx
inputs:
  image: [1, 3, 64, 64]
precision: w8a8
calibration:
  dir: models/calib/tiny_cnn
targets: [SM8650]
"""


def test_bad_toolchains_are_recipe_errors(tree: Path, ctxbuild, tmp_path: Path) -> None:
    keep_only(tree)
    for extra, says in [('toolchain: {qairt: "2.40"}\n', "tiny.yaml:8: toolchain: QAIRT 2.40 is older than the oldest"),
                        ('toolchain: [installed, "1.0.0"]\n', "tiny.yaml:8: toolchain: onnxruntime-qnn 1.0.0 is not"),
                        ("toolchain: 2.3\n", "tiny.yaml:8: toolchain"),
                        ('toolchain: "2.3.0"\nmulti_soc: true\n', "tiny.yaml:8: toolchain: multi_soc needs onnxruntime-qnn 2.5.0 or newer: 2.3.0 (QAIRT 2.47.0) ignores the SoC list")]:
        (tree / "tiny.yaml").write_text(RECIPE.replace("[SM8650]", "[SM8650, SM8750]") + extra)
        r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "-n")
        assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, (extra, r.text)


@pytest.fixture(scope="module")
def two_toolchains(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    """tiny built with the installed toolchain and, as tiny-qairt-2.47.0, with the release QAIRT 2.47 devices run."""
    import os
    import shutil
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("toolchains")
    shutil.copytree(example_models, root / "recipes" / "models")
    (root / "recipes" / "tiny.yaml").write_text(RECIPE + 'toolchain: [installed, {qairt: "2.47"}]\n')
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(root / "cache")}
    env.pop("MAKEFLAGS", None)
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(root / "recipes"), "-o", str(root / "out")],
                       capture_output=True, text=True, env=env, timeout=1200)
    if p.returncode != 0 and "cannot provision toolchain" in p.stderr:
        pytest.skip(f"onnxruntime-qnn 2.3.0 cannot be provisioned here (offline?): {p.stderr[-300:]}")
    assert p.returncode == 0, p.stdout + p.stderr
    return root


OLD = "SM8650/tiny-qairt-2.47.0/tiny-qairt-2.47.0_ctx.onnx"
NEW = "SM8650/tiny/tiny_ctx.onnx"


def test_each_toolchain_builds_its_variant(two_toolchains: Path) -> None:
    out = two_toolchains / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    made = {a["path"]: a for a in manifest["artifacts"] if a["kind"] == "epcontext_model"}
    assert made[NEW]["toolchain"] == "installed" and made[OLD]["toolchain"] == "onnxruntime-qnn-2.3.0"
    assert manifest["toolchains"]["onnxruntime-qnn-2.3.0"]["qairt"] == "2.47.0"
    # What each binary says compiled it: the EP stamps its QAIRT into the wrapper.
    assert made[OLD]["compatibility"]["qnn_sdk"].startswith("v2.47.0.")
    assert made[OLD]["compatibility"]["ep_compatibility_info"].startswith("6:2.47.0:")  # 2.3.0 writes V1
    assert made[NEW]["compatibility"]["qnn_sdk"].startswith("v2.51.0.")
    assert made[OLD]["verification"]["status"] == made[NEW]["verification"]["status"] == "passed"
    keys = {i: r["key_detail"]["toolchain"] for i, r in records(out).items() if r["kind"] == "compile"}
    assert keys["compile/tiny-qairt-2.47.0@SM8650"]["onnxruntime"] == "1.24.4"  # the key holds what ran
    assert keys["compile/tiny-qairt-2.47.0@SM8650"]["qnn_sdk"].startswith("v2.47.0.")
    assert keys["compile/tiny@SM8650"]["onnxruntime-qnn"] == INSTALLED


def test_the_gate_and_the_old_runtime_agree(two_toolchains: Path, ctxbuild) -> None:
    out = two_toolchains / "out"
    r = ctxbuild("check", str(out), "--runtime", "qairt=2.47", "--json")
    assert r.code == 1, r.text
    rows = json.loads(r.out)
    verdicts = {row["path"]: row["verdict"] for row in rows}
    assert verdicts == {OLD: "loads", NEW: "will not load"}
    # beside it, the EP's own verdict from the runtime's toolchain (2.3.0, provisioned by the build): it reads the
    # V1 string 2.3.0 wrote, and does not judge the V2 string 2.7.0 writes (EP_NOT_APPLICABLE)
    assert {row["path"]: (row["ep_verdict"], row["ep_runtime"]) for row in rows} == {
        OLD: ("loads", "2.3.0"), NEW: ("n/a", "2.3.0")}
    r = ctxbuild("check", str(out), "--runtime", "qairt=2.47", "--no-ep")
    assert r.code == 1 and "EP says" not in r.out, r.text
    python = old_runtime_python()  # its own virtualenv, not ctxbuild's provisioned toolchain
    old, new = load(python, out / OLD), load(python, out / NEW)
    assert old["ok"] and len(old["outputs"]) == 1, old["error"]
    assert not new["ok"] and "QNN_CONTEXT_ERROR_INVALID_ARGUMENT" in new["error"], new["error"]


def test_rebuilds_are_no_ops_and_a_fresh_out_restores_both(two_toolchains: Path, ctxbuild, tmp_path: Path) -> None:
    env = {"CTXBUILD_CACHE_DIR": str(two_toolchains / "cache")}
    r = ctxbuild("build", str(two_toolchains / "recipes"), "-o", str(two_toolchains / "out"), env=env)
    assert r.code == 0 and "ctxbuild: up to date" in r.out, r.text
    fresh = tmp_path / "fresh"
    r = ctxbuild("build", str(two_toolchains / "recipes"), "-o", str(fresh), env=env)
    assert r.code == 0 and "0 built" in r.out, r.text
    for rel in (OLD, NEW):
        assert (fresh / rel).read_bytes() == (two_toolchains / "out" / rel).read_bytes()


def _planned(ctxbuild, tree: Path, out: Path) -> dict[str, str | None]:
    r = ctxbuild("plan", str(tree), "-o", str(out), "--format", "json")
    assert r.code == 0, r.text
    return {a["id"]: a["toolchain"] for a in json.loads(r.out)["actions"]}


def test_a_target_group_names_the_toolchain_its_fleet_needs(tree: Path, ctxbuild, tmp_path: Path) -> None:
    keep_only(tree)
    (tree / "_defaults.yaml").write_text('target_groups:\n  old_fleet: {targets: [SM8550], toolchain: {qairt: "2.47"}}\n'
                                         "  new_fleet: [SM8750]\n")
    (tree / "tiny.yaml").write_text(RECIPE.replace("[SM8650]", "[SM8650, old_fleet, new_fleet]"))
    planned = _planned(ctxbuild, tree, tmp_path / "out")
    compiles = {i: tc for i, tc in planned.items() if i.startswith("compile/")}
    assert compiles == {"compile/tiny@SM8650": None, "compile/tiny@SM8750": None,
                        "compile/tiny-qairt-2.47.0@SM8550": "onnxruntime-qnn-2.3.0"}
    # Every action of the fleet's variant runs in its toolchain, none shared with the installed one's.
    assert sorted(str(tc) for i, tc in planned.items() if i.startswith(("prepare/", "quantize/"))) == [
        "None", "None", "onnxruntime-qnn-2.3.0", "onnxruntime-qnn-2.3.0"]

    (tree / "_defaults.yaml").write_text('target_groups:\n  old_fleet: {targets: [SM8550], toolchain: {qairt: "2.4"}}\n')
    (tree / "tiny.yaml").write_text(RECIPE.replace("[SM8650]", "[old_fleet]"))
    r = ctxbuild("plan", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2 and "_defaults.yaml:2: target_groups.old_fleet.toolchain: QAIRT 2.4 is older" in r.err, r.text


def test_one_toolchain_keeps_the_paths_and_several_make_variants(tree: Path, ctxbuild, tmp_path: Path) -> None:
    keep_only(tree)
    (tree / "tiny.yaml").write_text(RECIPE + 'toolchain: {qairt: "2.47"}\n')
    assert _planned(ctxbuild, tree, tmp_path / "a")["compile/tiny@SM8650"] == "onnxruntime-qnn-2.3.0"
    (tree / "tiny.yaml").write_text(RECIPE + 'toolchain: [{qairt: "2.49"}, installed, "2.5.0"]\n')  # 2.5.0 twice
    compiles = {i: tc for i, tc in _planned(ctxbuild, tree, tmp_path / "b").items() if i.startswith("compile/")}
    assert compiles == {"compile/tiny@SM8650": "onnxruntime-qnn-2.5.0", "compile/tiny-qairt-2.51.0@SM8650": None}


def test_a_damaged_toolchain_is_named_and_repaired(ctxbuild, tmp_path: Path) -> None:
    """A provisioned toolchain whose files changed (a truncated QNN library) lists as damaged with the fix, and
    `toolchain provision` repairs it (before: listed as provisioned, provision exited 0 and changed nothing)."""
    env = {"CTXBUILD_TOOLCHAINS_DIR": str(tmp_path / "toolchains")}
    r = ctxbuild("toolchain", "provision", "2.3.0", env=env, timeout=1200)
    if r.code != 0 and "cannot provision toolchain" in r.err:
        pytest.skip(f"onnxruntime-qnn 2.3.0 cannot be provisioned here (offline?): {r.err[-300:]}")
    assert r.code == 0, r.text
    (lib,) = (tmp_path / "toolchains" / "onnxruntime-qnn-2.3.0" / "site").rglob("libQnnHtp.so")
    lib.write_bytes(lib.read_bytes()[:1000])
    r = ctxbuild("toolchain", "list", env=env)
    assert r.code == 0 and "damaged: " in r.out and "libQnnHtp.so has changed size" in r.out, r.text
    assert "`ctxbuild toolchain provision 2.3.0` repairs it" in r.out
    r = ctxbuild("toolchain", "provision", "2.3.0", env=env, timeout=1200)
    assert r.code == 0 and "is damaged" in r.err and "provisioning it again" in r.err, r.text
    assert lib.stat().st_size > 1000
    r = ctxbuild("toolchain", "list", env=env)
    assert "2.3.0            2.47.0    provisioned" in r.out, r.out


def test_provisioning_dies_with_the_build(tmp_path: Path) -> None:
    """kill -9 of ctxbuild while pip provisions: pip goes with it, nothing keeps writing into the toolchain."""
    import os
    import signal
    import subprocess
    import sys
    import time

    home = tmp_path / "toolchains"
    env = {**os.environ, "CTXBUILD_TOOLCHAINS_DIR": str(home)}
    p = subprocess.Popen([sys.executable, "-m", "ctxbuild", "toolchain", "provision", "2.3.0"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def pips() -> list[int]:
        found = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and str(home) in (d / "cmdline").read_bytes().decode(errors="replace") \
                        and b"pip" in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
        return found

    deadline = time.monotonic() + 60
    while not pips() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if p.poll() is not None:
        pytest.skip("provisioning finished before pip could be seen running")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 5
    while pips() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pips(), "pip outlived the killed build"
