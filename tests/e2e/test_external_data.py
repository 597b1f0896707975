"""Models whose weights live in ONNX external data, end to end, on small models (the >2 GB build is in
test_big_model.py): prepare writes `<model>.data`, compiles are byte-identical in any OUT directory,
memory estimates and peak RSS reach the records and the report, `embed: true` over 2 GB is refused at
plan time, and an action that cannot fit in the memory budget fails before it starts."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from pathlib import Path

import onnx
import pytest

from ctxbuild.plan import memory
from ctxbuild.qnn.staging import fixed_dir
from tests._big_models import matmul_chain
from tests.conftest import last_build, records

RECIPE = """name: chain
model: chain.onnx
precision: {precision}
targets: [SM8650]
"""


def _tree(root: Path, precision: str = "fp16", dim: int = 512, layers: int = 4, extra: str = "") -> Path:
    root.mkdir(parents=True)
    matmul_chain(root / "chain.onnx", dim=dim, layers=layers, precision=precision)
    (root / "chain.yaml").write_text(RECIPE.format(precision=precision) + extra)
    return root


def _files(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((out / "SM8650").rglob("*")) if p.is_file()}


@pytest.mark.parametrize("precision", ["fp16", "qdq"])
def test_external_data_model_builds_byte_identical_in_two_out_dirs(tmp_path: Path, ctxbuild, precision: str) -> None:
    src = _tree(tmp_path / "recipes", precision)
    outs = [tmp_path / "a" / "out", tmp_path / "elsewhere" / "deeper" / "out"]
    for out in outs:
        r = ctxbuild("build", str(src), "-o", str(out), "--no-cache")
        assert r.code == 0, r.text
    assert _files(outs[0]) == _files(outs[1])
    assert {Path(k).name for k in _files(outs[0])} == {"chain_ctx.onnx", "chain_ctx_qnn.bin", "chain_verify.json"}
    prepared = next((outs[0] / ".ctxbuild" / "work").glob("chain-*/prepared.onnx"))
    data = prepared.with_name("prepared.onnx.data")
    assert data.stat().st_size >= 4 * 512 * 512  # every weight went to the external file
    assert prepared.stat().st_size < 64 << 10
    model = onnx.load(str(prepared), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer if t.name[1:].isdigit())
    result = json.loads((outs[0] / "SM8650" / "chain" / "chain_verify.json").read_text())
    assert result["passed"], result


def test_records_and_report_carry_memory(tmp_path: Path, ctxbuild) -> None:
    src = _tree(tmp_path / "recipes")
    out = tmp_path / "out"
    r = ctxbuild("build", str(src), "-o", str(out), "--memory-budget", "6G")
    assert r.code == 0, r.text
    recs = records(out)
    assert {r["kind"] for r in recs.values()} == {"prepare", "compile", "verify"}
    for rec in recs.values():
        assert rec["memory_estimate"] >= memory.BASE
        assert 50 << 20 < rec["peak_rss"] < rec["memory_estimate"], rec["id"]
    report = json.loads((out / "report.json").read_text())
    assert report["memory"]["budget"] == 6 * 10**9
    assert 10 << 20 < report["memory"]["driver_peak_rss"] < 1 << 30
    assert {a["id"] for a in report["memory"]["actions"]} == set(recs)
    html = (out / "report.html").read_text()
    assert 'id="memory"' in html and "compile/chain@SM8650" in html


def test_action_over_the_memory_budget_fails_before_running(tmp_path: Path, ctxbuild) -> None:
    src = _tree(tmp_path / "recipes", dim=1024)
    out = tmp_path / "out"
    r = ctxbuild("build", str(src), "-o", str(out), "--memory-budget", "300M")
    assert r.code == 1
    assert "needs an estimated" in r.err and "the budget is 286 MiB" in r.err and "RAM" in r.err, r.err
    assert "failed" in last_build(out).values()
    assert not (out / "SM8650" / "chain" / "chain_ctx_qnn.bin").exists()


def test_embed_over_two_gb_is_refused_at_plan_time(tmp_path: Path, ctxbuild) -> None:
    """The estimate needs only sizes: a sparse 2.2 GB data file stands in for the weights."""
    src = _tree(tmp_path / "recipes", extra="compile:\n  embed: true\n")
    with open(src / "chain.onnx.data", "r+b") as f:
        f.truncate(int(4.4 * 2**30))  # fp16 halves float32: a 2.2 GB binary
    r = ctxbuild("plan", str(src))
    assert r.code == 2, r.text
    line = next(i for i, s in enumerate((src / "chain.yaml").read_text().splitlines(), 1) if "embed" in s)
    assert f"chain.yaml:{line}: compile.embed" in r.err and "embed: false" in r.err, r.err


def test_scheduler_keeps_running_estimates_within_the_budget() -> None:
    s = memory.Scheduler(10)
    assert s.submit(6, "a") == [(6, "a")]
    s.started(1, 6)
    assert s.submit(6, "b") == []  # 12 > 10: waits
    assert s.submit(2, "c") == []  # first come, first served: does not overtake b
    assert s.finished(1) == [(6, "b"), (2, "c")]
    s.started(2, 6)
    s.started(3, 2)
    assert s.submit(20, "d") == []  # too big even alone: waits until nothing runs ...
    s.finished(2)
    assert s.finished(3) == [(20, "d")]  # ... then starts (and fails its own memory check)


def _stage_worker(key: str, log: Path) -> None:
    # the events are appended inside the block, each write done before the next line runs: the file's order is the
    # lock's (a multiprocessing.Queue's feeder threads may deliver one process's "out" after the next one's "in")
    with fixed_dir(key) as d:
        with open(log, "a") as f:
            f.write(f"in {os.getpid()}\n")
        (d / "x").write_text(str(os.getpid()))
        time.sleep(0.2)
        assert (d / "x").read_text() == str(os.getpid())
        with open(log, "a") as f:
            f.write(f"out {os.getpid()}\n")


def test_fixed_dir_is_exclusive_per_key_and_leaves_nothing(tmp_path: Path) -> None:
    """Two OUT dirs compiling the same action at once take turns on its staging directory."""
    key = hashlib.sha256(str(time.time()).encode()).hexdigest()
    log = tmp_path / "events"
    procs = [multiprocessing.get_context("fork").Process(target=_stage_worker, args=(key, log)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    events = [line.split() for line in log.read_text().splitlines()]
    assert len(events) == 6 and {pid for _, pid in events} == {str(p.pid) for p in procs}
    assert all(events[i] == ["in", events[i][1]] and events[i + 1] == ["out", events[i][1]] for i in range(0, 6, 2))
    assert not list(Path("/tmp").glob(f"ctxbuild-stage-{key[:24]}*"))
