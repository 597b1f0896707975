"""Under `make -jN`, ninja takes its job slots from make's jobserver (ninja 1.13.2 from PyPI reads make 4.3's
pipe protocol itself: ctxbuild relays nothing), quietly; under `make -n`, ctxbuild only says what it would do."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import records

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")


def _max_overlap(out: Path) -> int:
    spans = [(r["started"], r["finished"]) for r in records(out).values()]
    events = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


@pytest.mark.parametrize("slots", [2])  # ninja alone runs nproc + 2 (3 on this 2-core machine, 10 on 8 cores)
def test_ninja_takes_slots_from_make(tree: Path, tmp_path: Path, cache_dir: Path, slots: int) -> None:
    out = tmp_path / "out"
    for p in tree.glob("*.yaml"):  # 10 actions, 8 of them able to run side by side
        if p.name not in ("tiny_cnn.yaml", "tiny_cnn_int8.yaml", "mlp_fp16.yaml", "_defaults.yaml"):
            p.unlink()
    (tmp_path / "Makefile").write_text(
        f"all:\n\t+{sys.executable} -m ctxbuild build {tree} -o {out} --compile-jobs 4 --no-verify\n")
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache_dir), "CTXBUILD_NO_CACHE": "1"}
    env.pop("MAKEFLAGS", None)
    p = subprocess.run(["make", f"-j{slots}", "-C", str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "warning" not in (p.stdout + p.stderr).lower() and "Jobserver" not in p.stdout + p.stderr
    planned = json.loads((out / ".ctxbuild" / "plan.json").read_text())["actions"]
    assert len(records(out)) == len(planned) == 10
    assert _max_overlap(out) == slots


def test_make_dry_run_builds_nothing(tree: Path, tmp_path: Path, cache_dir: Path) -> None:
    """make -n runs `+` lines (for recursive makes); ctxbuild then dry-runs, as $(MAKE) would."""
    out = tmp_path / "out"
    for p in tree.glob("*.yaml"):
        if p.name not in ("mlp_fp16.yaml", "_defaults.yaml"):
            p.unlink()
    (tmp_path / "Makefile").write_text(f"all:\n\t+{sys.executable} -m ctxbuild build {tree} -o {out}\n")
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache_dir)}
    env.pop("MAKEFLAGS", None)
    p = subprocess.run(["make", "-n", "-C", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "compile mlp_fp16@SM8650" in p.stdout
    assert not out.exists()  # nothing at all: no build.ninja, no state, no empty SoC directories (issue 33)


@pytest.mark.parametrize("flags,dry", [("n -j2 --jobserver-auth=3,4", True), ("kns", True), ("n", True),
                                       (" -j2 --jobserver-auth=3,4", False), ("s -j2", False), ("", False),
                                       ("--no-print-directory", False), ("FOO=n", False)])
def test_make_dry_run_flag(flags: str, dry: bool) -> None:
    from ctxbuild.engine.options import make_dry_run

    assert make_dry_run(flags) is dry
