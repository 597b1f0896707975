"""An LLM-sized model end to end: 2 GiB of float32 weights in external data (over protobuf's 2 GB limit),
fp16 on one SoC, built cold, then as a no-op, then restored from the cache into a fresh OUT.

Costs measured here: ~5 GB peak RSS (the compile), ~7 GB of disk, a few minutes. Every process of the
build runs under an address-space cap, and the build under a memory budget, so a wrong estimate fails
this test instead of pushing a shared machine into the OOM killer. Skips, saying why, when the machine
lacks the free memory or disk.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxbuild import machine
from ctxbuild.cache.files import hash_file
from tests._big_models import matmul_chain
from tests.conftest import ROOT, last_build, records

pytestmark = pytest.mark.e2e  # builds a >2 GB model with the real toolchain (minutes)

DIM, LAYERS = 8192, 8  # 8 x 8192^2 float32 = 2 GiB of weights; the binary holds them in fp16 (1 GiB)
NEED_RAM = 12 << 30  # free memory wanted before starting: the compile's ~5 GB plus room for everyone else
NEED_DISK = 10 << 30
ADDRESS_SPACE_CAP = 24 << 30  # per process; QNN reserves far more address space than it touches
BUDGET = "8G"


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))


def _ctxbuild(*args: str, cache: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache)}
    env.pop("MAKEFLAGS", None)
    return subprocess.run([sys.executable, "-m", "ctxbuild", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout, preexec_fn=_cap)


@pytest.fixture
def big_dir():
    """Under /tmp, deleted afterwards even on failure: pytest keeps tmp_path dirs, these hold gigabytes."""
    available = machine.meminfo()["MemAvailable"]
    if available < NEED_RAM:
        pytest.skip(f"needs {NEED_RAM >> 30} GiB of available memory, this machine has {available / 2**30:.1f} GiB now")
    if shutil.disk_usage("/tmp").free < NEED_DISK:
        pytest.skip(f"needs {NEED_DISK >> 30} GiB free disk under /tmp")
    d = Path(f"/tmp/ctxbuild-bigtest-{os.getpid()}")
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_model_over_2gb_builds_no_ops_and_restores_byte_identical(big_dir: Path) -> None:
    src, cache = big_dir / "recipes", big_dir / "cache"
    src.mkdir()
    weights = matmul_chain(src / "llm.onnx", dim=DIM, layers=LAYERS, precision="fp16")
    assert weights > 2**31 - 1  # over what a protobuf (an ONNX file without external data) can hold
    (src / "llm.yaml").write_text("name: llm\nmodel: llm.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    out1, out2 = big_dir / "out1", big_dir / "out2"

    start = time.monotonic()
    cold = _ctxbuild("build", str(src), "-o", str(out1), "--memory-budget", BUDGET, cache=cache, timeout=420)
    cold_s = time.monotonic() - start
    assert cold.returncode == 0, cold.stdout[-2000:] + cold.stderr[-3000:]
    recs = records(out1)
    assert {r["kind"] for r in recs.values()} == {"prepare", "compile"}  # verification is off by default ...
    report = json.loads((out1 / "report.json").read_text())
    [row] = report["rows"]
    assert any("not verified" in w and "verify: true" in w for w in row["warnings"])  # ... and the report says so
    mem = report["memory"]
    assert 10 << 20 < mem["driver_peak_rss"] < 1 << 30
    assert {a["id"] for a in mem["actions"]} == set(recs)
    for a in mem["actions"]:
        assert a["source"] == "run" and a["peak_rss"] <= a["estimate"], a  # the estimate is an upper bound
    compile_rec = recs["compile/llm@SM8650"]
    assert compile_rec["peak_rss"] > weights // 2  # it really held the weights
    binary = out1 / "SM8650" / "llm" / "llm_ctx_qnn.bin"
    assert binary.stat().st_size > 2**30  # fp16 weights: half the float32 bytes
    html = (out1 / "report.html").read_text()
    assert 'id="memory"' in html and "compile/llm@SM8650" in html

    noop = _ctxbuild("build", str(src), "-o", str(out1), cache=cache, timeout=60)
    assert noop.returncode == 0 and "ctxbuild: up to date" in noop.stdout, noop.stdout + noop.stderr

    start = time.monotonic()
    warm = _ctxbuild("build", str(src), "-o", str(out2), "--memory-budget", BUDGET, cache=cache, timeout=300)
    warm_s = time.monotonic() - start
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert set(last_build(out2).values()) == {"cache"}
    for f in sorted((out1 / "SM8650").rglob("*")):
        if f.is_file():
            twin = out2 / f.relative_to(out1)
            assert hash_file(f) == hash_file(twin), f.name
    print(f"\n{weights / 2**30:.2f} GiB weights: cold {cold_s:.0f} s, restore into a fresh OUT {warm_s:.0f} s; "
          + ", ".join(f"{a['kind']} peak {a['peak_rss'] / 2**30:.2f} GiB (est. {a['estimate'] / 2**30:.2f})"
                      for a in mem["actions"]))
