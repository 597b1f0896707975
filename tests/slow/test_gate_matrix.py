"""The deploy gate proven against real loads (#31): tiny_cnn built by every published onnxruntime-qnn for one SoC
of each HTP family, each wrapper loaded and run on the simulator in every release's own environment (its pinned
onnxruntime and QNN EP), and `ctxbuild check --runtime onnxruntime-qnn=R` agreeing with what happened in every
cell. The x86 simulator ignores the HTP arch (a v79 binary runs under a v73 session), so loads prove the QAIRT
dimension; the arch is read from the binaries (test_gate.py). Provisions the four older toolchains: CI's slow step.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests._old_runtime import LOAD_SCRIPT
from tests.conftest import keep_only

pytestmark = pytest.mark.slow

RELEASES = ["2.3.0", "2.4.0", "2.5.0", "2.6.0", "2.7.0"]
SOCS = ["SC8380XP", "SM8650", "SM8750", "SM8850"]  # HTP v73, v75, v79, v81
RECIPE = """model: models/tiny_cnn.onnx
inputs: {image: [1, 3, 64, 64]}
precision: w8a16
calibration: {dir: models/calib/tiny_cnn}
verify: false
"""


def _runtime_env(release: str) -> dict[str, str]:
    """The environment that runs Python in `release` (its provisioned site first; the installed one as it is)."""
    from ctxbuild.toolchain import provision
    from ctxbuild.toolchain.choose import Toolchain
    from ctxbuild.toolchain.installed import version

    if release == version("onnxruntime-qnn"):
        return provision.env_for(None)
    tc = Toolchain(release)
    provision.ensure(tc, say=lambda line: None)
    return provision.env_for(tc)


def test_check_agrees_with_every_release_loading_every_releases_binaries(tree: Path, tmp_path: Path,
                                                                        ctxbuild) -> None:
    keep_only(tree)
    toolchains = ", ".join(f'"{r}"' for r in RELEASES)
    (tree / "tiny.yaml").write_text(RECIPE + f"targets: [{', '.join(SOCS)}]\ntoolchain: [{toolchains}]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), timeout=3000)
    if r.code != 0 and "cannot provision toolchain" in r.err:
        pytest.skip(f"the older toolchains cannot be provisioned here (offline?): {r.err[-300:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    wrappers = {a["path"]: a for a in manifest["artifacts"] if a["kind"] == "epcontext_model"}
    built = {(a.get("toolchain"), a["target"]["name"]) for a in wrappers.values()}
    # every SoC family builds with every release; a combination that could not is a failure of the build above
    assert len(built) == len(RELEASES) * len(SOCS), (r.err[-3000:], sorted(built))

    cells, refused, disagree = 0, 0, []
    for release in RELEASES:
        env = _runtime_env(release)
        check = ctxbuild("check", str(out), "--runtime", f"onnxruntime-qnn={release}", "--json", timeout=600)
        assert check.code in (0, 1), check.text
        verdict = {row["path"]: row for row in json.loads(check.out)}
        for path in wrappers:
            p = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(out / path)], capture_output=True, text=True,
                               env=env, timeout=600)
            assert p.returncode == 0, p.stderr[-2000:]
            loaded = json.loads(p.stdout.strip().splitlines()[-1])
            says_loads = verdict[path]["verdict"] != "will not load"
            cells += 1
            if says_loads != loaded["ok"]:
                disagree.append(f"{path} on {release}: gate {verdict[path]['verdict']!r} ({verdict[path]['reason']}), "
                                f"real: {'ran' if loaded['ok'] else loaded['error'][:200]}")
            if not loaded["ok"]:  # the one way a binary from a newer QAIRT fails: at session creation
                refused += 1
                assert "QNN_CONTEXT_ERROR_INVALID_ARGUMENT" in loaded["error"], loaded["error"][:500]
    assert cells == len(RELEASES) ** 2 * len(SOCS)
    assert not disagree, "\n".join(disagree)
    # forward-only by QAIRT major.minor, measured: each runtime refuses exactly the newer releases' binaries
    assert refused == len(RELEASES) * (len(RELEASES) - 1) // 2 * len(SOCS), refused
