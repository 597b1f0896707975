"""The early stop's bound (verify/early_stop.py) against the metrics it predicts (verify/measure.py), and the
ladder walk the search's gates and select share (verify/ladder.py). Pure numpy / JSON: no simulator."""
from __future__ import annotations

import numpy as np

from ctxbuild.verify.early_stop import EarlyStop
from ctxbuild.plan.search import CPU_MARGIN_DB
from ctxbuild.verify.ladder import cpu_rejection, hopeless, state_of, walk
from ctxbuild.verify.measure import failures, metrics

THR = {"min_cosine": 0.99, "min_snr_db": 20.0}


def _case(rng: np.random.Generator, n: int, noise: list[float]) -> tuple[np.ndarray, list[np.ndarray]]:
    ref = rng.standard_normal((n, 10)).astype(np.float32)
    got = [ref[i:i + 1] + rng.standard_normal((1, 10)).astype(np.float32) * noise[i] for i in range(n)]
    return ref, got


def test_a_stop_is_a_proof_and_a_pass_is_never_stopped() -> None:
    rng = np.random.default_rng(0)
    stops = passes = 0
    for trial in range(400):
        n = int(rng.integers(2, 7))
        noise = list(rng.choice([0.0, 0.01, 0.05, 0.2, 1.0], n))
        ref, got = _case(rng, n, noise)
        final = metrics(ref, np.concatenate(got))
        passed = not failures({"outputs": {"y": final}, "thresholds": THR})
        stop = EarlyStop({"y": ref}, n, **THR)
        stopped_at = next((i for i in range(1, n) if stop([{"y": g} for g in got[:i]])), None)
        if stopped_at is not None:
            stops += 1
            assert not passed, (trial, noise, final)  # never stops a run that would pass
        passes += passed
    assert stops > 50 and passes > 50  # both kinds of case were exercised


def test_one_bad_sample_the_aggregate_absorbs_does_not_stop() -> None:
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((8, 100)).astype(np.float32)
    ref[0] *= 0.01  # a quiet first sample, badly reproduced: its own SNR is poor, the aggregate's is not
    got = [ref[i:i + 1] + (0.003 if i == 0 else 0.0) * rng.standard_normal((1, 100)).astype(np.float32) for i in range(8)]
    assert metrics(ref[:1], got[0])["snr_db"] < 20
    assert metrics(ref, np.concatenate(got))["snr_db"] > 20
    assert not EarlyStop({"y": ref}, 8, **THR)([{"y": got[0]}])


def test_walk_stops_at_the_first_pass_and_rejects_on_cpu() -> None:
    good = {"outputs": {"y": {"cosine": 0.9999, "snr_db": 40.0}}}
    bad = {"outputs": {"y": {"cosine": 0.98, "snr_db": 15.0}}}
    far = {"outputs": {"y": {"cosine": 0.9, "snr_db": 20.0 - CPU_MARGIN_DB - 1}}}
    rows = walk(["a", "b", "c", "d"], {"a": far, "b": good, "c": good, "d": good}, {"b": bad, "c": good}, THR, CPU_MARGIN_DB)
    assert [r["state"] for r in rows] == ["rejected_cpu", "failed", "passed", "not_run"]
    assert rows[3]["why"] == "not run: c passed" and rows[0]["why"].startswith("rejected on CPU (13.0 dB")
    # the gates' questions: what is not known yet is pending, and the walk goes no further
    assert state_of(walk(["a", "b"], {"a": good}, {}, THR, CPU_MARGIN_DB), "a") == "pending"
    assert state_of(walk(["a", "b"], {"a": good}, {}, THR, CPU_MARGIN_DB), "b") == "unknown"
    assert cpu_rejection(bad, THR, CPU_MARGIN_DB) is None  # 5 dB short on the CPU: within the margin, the simulator decides


def test_a_candidate_onnxruntime_cannot_run_drops_out() -> None:
    """The screen's record of an onnxruntime failure (actions/screen.py) rejects that candidate with the reason;
    the walk goes on to the next (it ended the build with a traceback before)."""
    broke = {"outputs": {}, "error": "onnxruntime's CPU EP cannot run it: [ONNXRuntimeError] : 1 : FAIL : bad scale"}
    good = {"outputs": {"y": {"cosine": 0.9999, "snr_db": 40.0}}}
    rows = walk(["a", "b"], {"a": broke, "b": good}, {"b": good}, THR, CPU_MARGIN_DB)
    assert [r["state"] for r in rows] == ["rejected_cpu", "passed"]
    assert rows[0]["why"] == f"rejected on CPU ({broke['error']})"


def test_a_refusal_no_rung_changes_stops_the_search() -> None:
    stuck = {"compile_refused": {"error": "QNN cannot run 1 node(s): nz (NonZero)", "nodes": [["nz", "NonZero"]]},
             "outputs": {}}
    other = {"compile_refused": {"error": "QNN cannot run 1 node(s): fc1 (MatMul)", "nodes": [["fc1", "MatMul"]]},
             "outputs": {}}
    good = {"outputs": {"y": {"cosine": 1.0, "snr_db": 60.0}}}
    assert hopeless(stuck["compile_refused"]) and not hopeless(other["compile_refused"])
    rows = walk(["a", "b"], {"a": good, "b": good}, {"a": stuck}, THR, CPU_MARGIN_DB)
    assert [r["state"] for r in rows] == ["refused", "not_run"] and "NonZero at any precision" in rows[1]["why"]
    rows = walk(["a", "b"], {"a": good, "b": good}, {"a": other, "b": good}, THR, CPU_MARGIN_DB)
    assert [r["state"] for r in rows] == ["refused", "passed"]
