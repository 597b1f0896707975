"""The early stop's bound (verify/early_stop.py) against the metrics it predicts (verify/measure.py), and the
ladder walk the search's gates and select share (verify/ladder.py). Pure numpy / JSON: no simulator."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ctxbuild.verify.early_stop import EarlyStop
from ctxbuild.verify.ladder import hopeless, state_of, walk
from ctxbuild.verify.measure import failures, metrics
from ctxbuild.verify.predict import CPU_MARGIN_DB, cpu_rejection, rules

THR = {"min_cosine": 0.99, "min_snr_db": 20.0}
PREDICT = rules([])  # the margins, no weights-only variants


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
            # the recorded bound is one: the figure over all samples never exceeds it
            (b,) = stop.record(n)["bounds"]
            assert b["snr_db"] is None or final["snr_db"] <= b["snr_db"], (trial, b, final)
        passes += passed
    assert stops > 50 and passes > 50  # both kinds of case were exercised


def test_a_slice_stop_is_a_proof_too() -> None:
    """Outputs whose scores (0-1) sit beside boxes (0-300): the slice is bounded on its own, so a run whose
    score slice cannot pass stops although its whole output would; a run that passes every part never stops."""
    from ctxbuild.verify.slices import Slices, measure

    rng = np.random.default_rng(3)
    s = Slices(axis=1, sizes=(4, 6), labels=("boxes", "scores"), declared=False)
    stops = slice_stops = passes = 0
    for trial in range(400):
        n = int(rng.integers(2, 6))
        ref = np.concatenate([rng.uniform(0, 300, (n, 4)), rng.uniform(0, 1, (n, 6))], axis=1).astype(np.float32)
        noise = rng.choice([0.0, 0.001, 0.01, 0.1, 0.5], (n, 2))
        got = [ref[i:i + 1] + np.concatenate([rng.standard_normal((1, 4)) * noise[i, 0] * 300,
                                              rng.standard_normal((1, 6)) * noise[i, 1]], axis=1).astype(np.float32)
               for i in range(n)]
        whole = metrics(ref, np.concatenate(got))
        parts = measure(ref, np.concatenate(got), s, metrics)
        passed = not failures({"outputs": {"y": {**whole, "slices": parts}}, "thresholds": THR})
        stop = EarlyStop({"y": ref}, n, **THR, slices={"y": [(1, 0, 4), (1, 4, 10)]})
        stopped_at = next((i for i in range(1, n) if stop([{"y": g} for g in got[:i]])), None)
        if stopped_at is not None:
            stops += 1
            assert not passed, (trial, noise, whole, parts)
            bounds = {(b["output"], b.get("start")): b["snr_db"] for b in stop.record(n)["bounds"]}
            finals = {("y", None): whole["snr_db"], **{("y", p["start"]): p["snr_db"] for p in parts or []}}
            assert all(bounds[k] is None or finals[k] <= bounds[k] for k in finals) and len(bounds) == 3, (bounds, finals)
            slice_stops += "slice 4:10" in stop.proof and not failures({"outputs": {"y": whole}, "thresholds": THR})
        passes += passed
    assert stops > 50 and passes > 50 and slice_stops > 10, (stops, passes, slice_stops)


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
    bad = {"outputs": {"y": {"cosine": 0.985, "snr_db": 20.0 - CPU_MARGIN_DB + 0.5}}}
    far = {"outputs": {"y": {"cosine": 0.9, "snr_db": 20.0 - CPU_MARGIN_DB - 1}}}
    rows = walk(["a", "b", "c", "d"], {"a": far, "b": good, "c": good, "d": good}, {"b": bad, "c": good}, THR, PREDICT)
    assert [r["state"] for r in rows] == ["rejected_cpu", "failed", "passed", "not_run"]
    assert rows[3]["why"] == "not run: c passed"
    assert rows[0]["why"] == (f"skipped: CPU screen {19 - CPU_MARGIN_DB:.1f} dB, cosine 0.9000 at output 'y' "
                              f"< 20 dB, 0.99 - {CPU_MARGIN_DB:g} dB margin")
    # the gates' questions: what is not known yet is pending, and the walk goes no further
    assert state_of(walk(["a", "b"], {"a": good}, {}, THR, PREDICT), "a") == "pending"
    assert state_of(walk(["a", "b"], {"a": good}, {}, THR, PREDICT), "b") == "unknown"
    assert cpu_rejection(bad, THR, CPU_MARGIN_DB) is None  # short on the CPU within the margin: the simulator decides


def test_a_candidate_onnxruntime_cannot_run_drops_out() -> None:
    """The screen's record of an onnxruntime failure (actions/screen.py) rejects that candidate with the reason;
    the walk goes on to the next (it ended the build with a traceback before)."""
    broke = {"outputs": {}, "error": "onnxruntime's CPU EP cannot run its QDQ model: [ONNXRuntimeError] : 1 : FAIL : bad scale"}
    good = {"outputs": {"y": {"cosine": 0.9999, "snr_db": 40.0}}}
    rows = walk(["a", "b"], {"a": broke, "b": good}, {"b": good}, THR, PREDICT)
    assert [r["state"] for r in rows] == ["rejected_cpu", "passed"]
    assert rows[0]["why"] == f"skipped: {broke['error']}"


def test_a_refusal_no_rung_changes_stops_the_search() -> None:
    stuck = {"compile_refused": {"error": "QNN cannot run 1 node(s): nz (NonZero)", "nodes": [["nz", "NonZero"]]},
             "outputs": {}}
    other = {"compile_refused": {"error": "QNN cannot run 1 node(s): fc1 (MatMul)", "nodes": [["fc1", "MatMul"]]},
             "outputs": {}}
    good = {"outputs": {"y": {"cosine": 1.0, "snr_db": 60.0}}}
    assert hopeless(stuck["compile_refused"]) and not hopeless(other["compile_refused"])
    rows = walk(["a", "b"], {"a": good, "b": good}, {"a": stuck}, THR, PREDICT)
    assert [r["state"] for r in rows] == ["refused", "not_run"] and "NonZero at any precision" in rows[1]["why"]
    rows = walk(["a", "b"], {"a": good, "b": good}, {"a": other, "b": good}, THR, PREDICT)
    assert [r["state"] for r in rows] == ["refused", "passed"]


def _figures(rng: np.random.Generator, parts: list[str], snr: dict[str, float]) -> dict:
    """A result with one output `y` and, when asked, its slice `s`; cosine as a noise of that SNR gives."""
    def m(x: float) -> dict:
        return {"snr_db": round(x, 3), "cosine": round(1 - 0.5 * 10 ** (-x / 10), 6)}
    out = {"y": m(snr["y"])}
    if "s" in parts:
        out["y"]["slices"] = [{"slice": "s", "start": 4, "stop": 6, "range": 1.0, **m(snr["s"])}]
    return {"outputs": out}


def _case_ladder(rng: np.random.Generator) -> tuple[list[dict], dict, dict]:
    """A random ladder and the figures a model obeying the measured bounds gives: the HTP at most CPU_MARGIN_DB
    above the CPU on every part, and a weights-only variant's HTP shortfall at most HTP_RECOVERY_DB smaller than
    an earlier variant's (both with room: the bounds are the rules' own constants)."""
    from ctxbuild.verify.predict import HTP_RECOVERY_DB

    parts = ["y", "s"] if rng.random() < 0.5 else ["y"]
    ladder = [{"name": f"c{i}", "activations": str(rng.choice(["uint8", "uint16"], p=[0.2, 0.8])), "weights": f"w{i}"}
              for i in range(int(rng.integers(2, 6)))]
    screens, verifies, shortfall = {}, {}, {}
    for c in ladder:
        cpu = {p: float(rng.uniform(5, 50)) for p in parts}
        gap = {}
        for p in parts:
            # the least shortfall the earlier variants of the same group allow this one
            floor = max([shortfall[(a["name"], p)] for a in ladder[:ladder.index(c)]
                         if a["activations"] == c["activations"]], default=-np.inf) - HTP_RECOVERY_DB
            gap[p] = max(floor, -CPU_MARGIN_DB) + float(rng.choice([0.0, 0.0, 1.0, 10.0, 50.0]) * rng.random())
            shortfall[(c["name"], p)] = gap[p]
        screens[c["name"]] = _figures(rng, parts, cpu)
        verifies[c["name"]] = _figures(rng, parts, {p: cpu[p] - gap[p] for p in parts})
        if rng.random() < 0.3 and failures({**verifies[c["name"]], "thresholds": THR}):
            # partial figures; the proof's bounds lie above the figures over all samples (or are absent: a result
            # from before they were recorded)
            bounds = [{"output": "y", **({"start": 4, "stop": 6} if p == "s" else {}),
                       "snr_db": round(cpu[p] - gap[p] + float(rng.uniform(0, 3)), 3)} for p in parts]
            verifies[c["name"]]["early_stop"] = {"of": 4, "proof": "after 1 sample(s) ...",
                                                 **({"bounds": bounds} if rng.random() < 0.7 else {})}
    fp16 = {"outputs": {"y": {"snr_db": 30.0, "cosine": 0.9999}}} if rng.random() < 0.5 else \
        {"outputs": {"y": {"snr_db": 10.0, "cosine": 0.9}}}
    return ladder, screens, {**verifies, "fp16": fp16}


def _staged(names: list[str], screens: dict, verifies: dict, predict: dict,
            siblings: dict | None = None) -> tuple[list[dict], int]:
    """The search as its gates run it: each step learns only the result the walk asks for next."""
    known_s: dict = {}
    known_v: dict = {}
    while True:
        rows = walk(names, known_s, known_v, THR, predict, siblings)
        pending = next((r for r in rows if r["state"] == "pending"), None)
        if pending is None:
            return rows, len(known_v)
        n = pending["name"]
        if pending["why"] == "needs its CPU screen":
            known_s[n] = screens[n]
        else:
            known_v[n] = verifies[n]


def test_skipped_candidates_never_change_the_winner() -> None:
    """400 random ladders whose HTP figures obey the measured bounds: the staged search with both skipping rules
    picks the winner the full ladder's verdicts give (first candidate passing on the HTP, fp16 last), and runs
    fewer simulator runs; both rules fire in many cases."""
    rng = np.random.default_rng(32)
    fired = {"rejected_cpu": 0, "predicted_fail": 0}
    saved = bounded = 0
    for trial in range(400):
        ladder, screens, verifies = _case_ladder(rng)
        names = [c["name"] for c in ladder] + ["fp16"]
        truth = next((n for n in names if not failures({**verifies[n], "thresholds": THR})), None)
        rows, runs = _staged(names, screens, verifies, rules(ladder))
        winner = next((r["name"] for r in rows if r["state"] == "passed"), None)
        assert winner == truth, (trial, rows)
        plain = names.index(truth) + 1 if truth else len(names)  # every candidate up to the winner simulated
        assert runs <= plain
        saved += plain - runs
        for r in rows:
            fired[r["state"]] = fired.get(r["state"], 0) + 1
            bounded += "lost at least" in r.get("why", "")  # carried from an early-stopped run's proof
    assert fired["rejected_cpu"] > 100 and fired["predicted_fail"] > 20 and saved > 100 and bounded > 5, (fired, saved, bounded)


def test_an_htp_loss_skips_the_weights_only_variants() -> None:
    """The fall detector's figures (issue 32): the score slice reads 44 dB on the CPU and 1.5 dB on the HTP at
    w8a16; w8a16-pc and w16a16 (weights only differ) are skipped, fp16 runs; a candidate with other
    activations is not a weights-only variant and still runs."""
    ladder = [{"name": "w8a16", "activations": "uint16", "weights": "uint8"},
              {"name": "w8a16-pc", "activations": "uint16", "weights": "uint8", "per_channel": True},
              {"name": "w16a16", "activations": "uint16", "weights": "int16"},
              {"name": "w8a8", "activations": "uint8", "weights": "uint8"}]
    rng = np.random.default_rng(0)
    cpu = {n["name"]: _figures(rng, ["y", "s"], {"y": 50.0, "s": 44.0}) for n in ladder}
    htp = _figures(rng, ["y", "s"], {"y": 21.5, "s": 1.5})
    rows = walk([*cpu, "fp16"], cpu, {"w8a16": htp}, THR, rules(ladder))
    assert [r["state"] for r in rows] == ["failed", "predicted_fail", "predicted_fail", "pending"]
    assert rows[1]["why"] == ("skipped: w8a16 lost 42.5 dB on the HTP against its CPU run at output 'y' slice 4:6 (s); "
                              "10 dB of that back would still leave w8a16-pc at 11.5 dB < 20 dB")
    # an early-stopped run's figures cover some samples only: no prediction from them
    rows = walk([*cpu, "fp16"], cpu, {"w8a16": {**htp, "early_stop": {"of": 4, "proof": "..."}}}, THR, rules(ladder))
    assert [r["state"] for r in rows] == ["failed", "pending"]


def test_an_early_stopped_loss_carries_with_its_proof_bound() -> None:
    """The same detector, w8a16's run stopped after 1 sample: the figures over that sample bound nothing, the
    proof's bound on the score slice over all samples does (44 dB on the CPU, at most 3.2 dB on the HTP: at
    least 40.8 dB lost); a bound that leaves room, or a record without bounds, predicts nothing."""
    ladder = [{"name": "w8a16", "activations": "uint16", "weights": "uint8"},
              {"name": "w8a16-pc", "activations": "uint16", "weights": "uint8", "per_channel": True}]
    rng = np.random.default_rng(0)
    cpu = {n["name"]: _figures(rng, ["y", "s"], {"y": 50.0, "s": 44.0}) for n in ladder}
    partial = _figures(rng, ["y", "s"], {"y": 23.0, "s": 1.0})

    def stopped(slice_bound: float | None) -> dict:
        bounds = [{"output": "y", "snr_db": 40.0}] + (
            [{"output": "y", "start": 4, "stop": 6, "snr_db": slice_bound}] if slice_bound is not None else [])
        return {**partial, "early_stop": {"of": 4, "proof": "after 1 sample(s) output 'y' slice 4:6 ...", "bounds": bounds}}

    rows = walk([*cpu, "fp16"], cpu, {"w8a16": stopped(3.2)}, THR, rules(ladder))
    assert [r["state"] for r in rows] == ["failed", "predicted_fail", "pending"]
    assert rows[1]["why"] == ("skipped: w8a16 lost at least 40.8 dB on the HTP against its CPU run at output 'y' "
                              "slice 4:6 (s); 10 dB of that back would still leave w8a16-pc at 13.2 dB < 20 dB")
    for bound in (30.0, None):  # 14 dB lost at most: room left; no bound for the slice: nothing known
        rows = walk([*cpu, "fp16"], cpu, {"w8a16": stopped(bound)}, THR, rules(ladder))
        assert [r["state"] for r in rows] == ["failed", "pending"], bound


def test_det_320s_int16_weight_failure_is_not_a_carried_loss() -> None:
    """The PP-OCR detector at 320x320 as recorded by a cold build x SM8650/SM8750 (bench/search_bench.py --save;
    docs/measured.md, "What is left"): w8a16 rejected on the CPU (15.5 dB), w8a16-pc 25.4 dB on the CPU and
    19.727 dB on the simulator. Even with none of that 5.7 dB loss won back, w16a16 (38.2 dB on the CPU) keeps
    room, so the simulator decides it (16.99 dB over 3 samples, at most 18.39 over 4: its own loss, not
    w8a16-pc's); the diagnosis blamed no node and fp16 wins on both SoCs, SM8750 running it alone. Replayed,
    the recorded search runs what it ran: 4 simulator runs, the same seconds and winners."""
    from bench.search_bench import replay

    figures = json.loads((Path(__file__).parents[2] / "bench/real_models/search_figures/ppocr_det_320.json").read_text())
    first = figures["targets"]["select/ppocr_det_320@SM8650"]
    ladder = [{"name": c["name"], **c.get("quantization", {})} for c in first["candidates"] if "quantization" in c]
    verifies = {n: v["result"] for n, v in first["verifies"].items()}
    for recovery in (rules(ladder)["htp_recovery_db"], 0.0):
        rows = walk(["w8a16", "w8a16-pc", "w16a16"], first["screens"], {"w8a16-pc": verifies["w8a16-pc"]}, THR,
                    {**rules(ladder), "htp_recovery_db": recovery})
        assert [r["state"] for r in rows] == ["rejected_cpu", "failed", "pending"], recovery
    assert verifies["w16a16"]["early_stop"]["bounds"] == [{"output": "sigmoid_0.tmp_0", "snr_db": 18.391}]
    again = replay(figures)
    assert again["verify_actions"] == {"base": 4, "this tree": 4} and again["same_winners"]
    assert again["targets"]["select/ppocr_det_320@SM8650"]["states"] == {
        "w8a16": "rejected_cpu", "w8a16-pc": "failed", "w16a16": "failed", "mixed": "not_run", "fp16": "passed"}
    assert again["targets"]["select/ppocr_det_320@SM8750"]["simulator_runs"] == ["fp16"]


def test_a_failure_on_a_sibling_soc_is_skipped_and_the_winner_verified() -> None:
    """The second target of a recipe skips what the first measured failing (an early-stopped run too: its stop is
    a proof) and names it; the first's winner and what it never measured run here; a refusal is not carried."""
    good = {"outputs": {"y": {"cosine": 0.9999, "snr_db": 40.0}}}
    htp_loss = {"outputs": {"y": {"cosine": 0.97, "snr_db": 15.2}}, "early_stop": {"of": 4, "proof": "after 2 sample(s) x"}}
    refused = {"compile_refused": {"error": "QNN cannot run 1 node(s): fc1 (MatMul)", "nodes": []}, "outputs": {}}
    screens = {n: good for n in "abcd"}
    first = {"a": htp_loss, "b": refused, "c": good}
    rows = walk(list("abcd"), screens, {}, THR, PREDICT, {"SM8650": first})
    assert [r["state"] for r in rows] == ["predicted_fail", "pending"]
    assert rows[0]["predicted_by"] == "SM8650" and rows[0]["why"] == (
        "skipped: failed on SM8650's simulator, SNR 15.2 dB at output 'y' < 20 dB (stopped early: after 2 sample(s) "
        "x); the sibling SoCs' simulators agree (predicted from SM8650's measurement)")
    rows = walk(list("abcd"), screens, {"b": good, "c": good}, THR, PREDICT, {"SM8650": first})
    assert [r["state"] for r in rows] == ["predicted_fail", "passed", "not_run", "not_run"]
    assert not any("disagrees" in r for r in rows)
    # without siblings (auto: {siblings: false}) the same walk verifies `a` here
    assert state_of(walk(list("abcd"), screens, {}, THR, PREDICT), "a") == "pending"


def test_a_sibling_contradicted_here_is_no_longer_trusted() -> None:
    """The first target's winner fails here: the row says how the SoCs differ and the later candidates are
    decided by this target's own runs (the sibling's failure of `c` no longer skips it)."""
    good = {"outputs": {"y": {"cosine": 0.9999, "snr_db": 40.0}}}
    bad = {"outputs": {"y": {"cosine": 0.98, "snr_db": 18.0}}}
    screens = {n: good for n in "abc"}
    first = {"a": bad, "b": good, "c": bad}
    rows = walk(list("abc"), screens, {"b": bad}, THR, PREDICT, {"SM8650": first})
    assert [r["state"] for r in rows] == ["predicted_fail", "failed", "pending"]
    assert rows[1]["disagrees"] == "b failed here at 18.0 dB where SM8650's simulator passed it at 40.0 dB"
    # both pass, figures apart by more than the tolerance: the same
    close = {"outputs": {"y": {"cosine": 0.9999, "snr_db": 39.8}}}
    far = {"outputs": {"y": {"cosine": 0.9999, "snr_db": 30.0}}}
    assert "disagrees" not in walk(list("abc"), screens, {"b": close}, THR, PREDICT, {"SM8650": first})[1]
    assert "disagrees" in walk(list("abc"), screens, {"b": far}, THR, PREDICT, {"SM8650": first})[1]


def test_siblings_that_agree_never_change_a_winner() -> None:
    """400 random ladders on two targets whose simulators agree (as measured on v73/v75/v79): the second target's
    staged search with the first's measurements as siblings picks the winner its own full ladder gives, with
    fewer simulator runs in total."""
    rng = np.random.default_rng(9)
    alone = together = fired = 0
    for trial in range(400):
        ladder, screens, verifies = _case_ladder(rng)
        names = [c["name"] for c in ladder] + ["fp16"]
        truth = next((n for n in names if not failures({**verifies[n], "thresholds": THR})), None)
        first, runs_first = _staged(names, screens, verifies, rules(ladder))
        measured = {r["name"]: verifies[r["name"]] for r in first if r["state"] in ("passed", "failed")}
        second, runs_second = _staged(names, screens, verifies, rules(ladder), {"A": measured})
        winner = next((r["name"] for r in second if r["state"] == "passed"), None)
        assert winner == truth, (trial, second)
        assert runs_second <= (1 if truth else runs_first)  # at most the winner: every failure was measured on A
        alone += 2 * runs_first
        together += runs_first + runs_second
        fired += sum("predicted_by" in r for r in second)
    assert together < 0.85 * alone and fired > 150, (together, alone, fired)


def test_a_contradicted_sibling_is_a_warning_naming_what_it_skipped(tmp_path) -> None:
    """What ships is verified on its own SoC; the candidates skipped on the contradicted sibling's measurement
    are named with the way to search this SoC on its own."""
    from ctxbuild.actions.select import warnings
    from ctxbuild.plan.action import Action

    rows = [{"name": "w8a16", "state": "predicted_fail", "predicted_by": "SM8650"},
            {"name": "w8a16-pc", "state": "failed", "disagrees": "w8a16-pc failed here at 18.0 dB where SM8650's "
                                                                 "simulator passed it at 21.8 dB"},
            {"name": "w16a16", "state": "passed"}]
    search = tmp_path / "search.json"
    search.write_text(json.dumps({"candidates": rows}))
    a = Action(id="select/m@SM8750", kind="select", description="select m@SM8750 (3 candidates)", inputs={},
               outputs={"search": str(search)}, params={}, target={"name": "SM8750"})
    assert warnings(a) == [
        "select m@SM8750 (3 candidates): w8a16-pc failed here at 18.0 dB where SM8650's simulator passed it at 21.8 dB: "
        "the SoCs' simulators differ on this model; w8a16 (skipped on SM8650's measurement) not verified on SM8750; "
        "`auto: {siblings: false}` searches SM8750 on its own"]
    search.write_text(json.dumps({"candidates": rows[1:]}))  # nothing skipped on it: nothing to say
    assert warnings(a) == []


def test_an_htp_loss_on_a_sibling_carries_to_the_weights_only_variants() -> None:
    """The fall detector's case on a second SoC: the first measured w8a16's loss and skipped w8a16-pc and w16a16
    on it (never measured there); the second skips all three, naming the first's measurement, though its own
    w8a16 result is a closed gate's placeholder."""
    ladder = [{"name": "w8a16", "activations": "uint16", "weights": "uint8"},
              {"name": "w8a16-pc", "activations": "uint16", "weights": "uint8", "per_channel": True},
              {"name": "w16a16", "activations": "uint16", "weights": "int16"}]
    rng = np.random.default_rng(0)
    cpu = {n["name"]: _figures(rng, ["y", "s"], {"y": 50.0, "s": 44.0}) for n in ladder}
    htp = _figures(rng, ["y", "s"], {"y": 21.5, "s": 1.5})
    rows = walk([*cpu, "fp16"], cpu, {"w8a16": {"skipped": True}}, THR, rules(ladder), {"SM8650": {"w8a16": htp}})
    assert [(r["state"], r.get("predicted_by")) for r in rows] == [
        ("predicted_fail", "SM8650"), ("predicted_fail", "SM8650"), ("predicted_fail", "SM8650"), ("pending", None)]
    assert rows[1]["why"].startswith("skipped: w8a16 lost 42.5 dB on the HTP (SM8650's measurement) against its CPU run")
