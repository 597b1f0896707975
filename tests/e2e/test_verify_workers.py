"""Verification over several simulator children (verify/sample_workers.py): the same bytes as one child."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ctxbuild import settings
from ctxbuild.errors import ActionError
from ctxbuild.verify import sample_workers
from ctxbuild.verify.measure import simulate
from tests.conftest import keep_only, records


def test_samples_split_over_children_give_the_serial_bytes_and_metrics(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "tiny_cnn.yaml")
    results, ctx = {}, None
    for workers in ("1", "3"):
        out = tmp_path / f"out{workers}"
        # --no-cache: the second build must run the simulator again, not restore the first one's outputs
        r = ctxbuild("build", str(tree), "-o", str(out), "--no-cache", env={settings.VERIFY_WORKERS.name: workers})
        assert r.code == 0, r.text
        recs = {i: rec for i, rec in records(out).items() if rec["kind"] == "verify"}
        assert recs and all(rec["simulator_workers"] == int(workers) for rec in recs.values())
        results[workers] = {i: rec["result"] for i, rec in recs.items()}
        ctx = out / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx.onnx"
    assert json.dumps(results["1"], sort_keys=True) == json.dumps(results["3"], sort_keys=True)

    samples = [dict(np.load(p)) for p in sorted((tree / "models" / "calib" / "tiny_cnn").glob("*.npz"))][:5]
    assert len(samples) >= 4
    serial = simulate(ctx, samples, cpu_fallback=False, timeout=300, workers=1)
    for workers in (2, 3, len(samples) + 2):  # uneven slices, and more children asked than samples
        timing: dict[str, float] = {}
        split = simulate(ctx, samples, cpu_fallback=False, timeout=300, timing=timing, workers=workers)
        assert serial.keys() == split.keys() and set(timing) == {"load", "run"}
        for name in serial:
            assert serial[name].dtype == split[name].dtype and serial[name].tobytes() == split[name].tobytes()


def test_worker_count_is_bounded_by_samples_and_a_forced_count_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.VERIFY_WORKERS.name, "8")
    assert sample_workers.count(3, 1 << 20) == 3
    monkeypatch.setenv(settings.VERIFY_WORKERS.name, "1")
    assert sample_workers.count(4, 1 << 20) == 1
    monkeypatch.setenv(settings.VERIFY_WORKERS.name, "two")
    with pytest.raises(ActionError, match="CTXBUILD_VERIFY_WORKERS='two'"):
        sample_workers.count(4, 1 << 20)
    monkeypatch.delenv(settings.VERIFY_WORKERS.name)
    n = sample_workers.count(4, 1 << 20)
    assert 1 <= n <= min(4, len(os.sched_getaffinity(0)))
    assert sample_workers.count(4, 1 << 50) == 1  # a child per petabyte: no room for a second one
