"""Under `make -jN`, ninja takes its job slots from make's jobserver (relayed for make 4.3's pipe protocol)."""
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


@pytest.mark.parametrize("slots", [2, 3])  # ninja alone would run 4 at once on 2 cores
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
    assert "warning" not in (p.stdout + p.stderr).lower()
    planned = json.loads((out / ".ctxbuild" / "plan.json").read_text())["actions"]
    assert len(records(out)) == len(planned) == 10
    assert _max_overlap(out) == slots
