"""precision: auto: a search DAG of cached candidates, a select per target, re-decided without recompiling;
and verification outputs reused for byte-identical binaries."""
from __future__ import annotations

import json
from pathlib import Path

import onnx

from tests._qnn_models import matmul_nonzero_model
from tests.conftest import TINY_CNN, last_build, records

HEAD = TINY_CNN + "calibration: {dir: models/calib/tiny_cnn}\n"
# Measured on tiny_cnn @ SM8650 (SNR of `logits`): w8a16 34.4 dB, w8a16-pc 37.9 dB, w16a16 57.9 dB.
AUTO = HEAD + "precision: auto\ntargets: [SM8650]\nverify: {min_snr_db: %s}\n"


def _only(tree: Path, recipes: dict[str, str]) -> None:
    for p in tree.glob("*.yaml"):
        if p.name != "_defaults.yaml":
            p.unlink()
    for name, body in recipes.items():
        (tree / f"{name}.yaml").write_text(body)


def _search(out: Path) -> dict:
    return json.loads((out / "SM8650" / "auto" / "auto_search.json").read_text())


def _compiled(out: Path) -> set[str]:
    """The compile actions of the last build that compiled (not restored, not a closed gate's placeholders)."""
    recs = records(out)
    return {i for i, how in last_build(out).items() if i.startswith("compile/") and how == "run"
            and not recs[i].get("skipped")}


def test_auto_picks_first_passing_candidate_and_redecides_without_recompiling(tree: Path, tmp_path: Path,
                                                                           ctxbuild) -> None:
    _only(tree, {"auto": AUTO % 36})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    s = _search(out)
    assert [c["name"] for c in s["candidates"]] == ["w8a16", "w8a16-pc", "w16a16", "mixed", "fp16"]
    assert [c["state"] for c in s["candidates"]] == ["failed", "passed", "not_run", "not_run", "not_run"]
    assert s["winner"] == "w8a16-pc"
    d = out / "SM8650" / "auto"
    work = out / ".ctxbuild" / "work" / "search" / "SM8650" / "auto"
    assert (d / "auto_ctx_qnn.bin").read_bytes() == (work / "w8a16-pc" / "auto_ctx_qnn.bin").read_bytes()
    assert (d / "auto_ctx.onnx").read_bytes() == (work / "w8a16-pc" / "auto_ctx.onnx").read_bytes()
    verdict = json.loads((d / "auto_verify.json").read_text())
    assert verdict["passed"] and verdict["candidate"] == "w8a16-pc" and verdict["outputs"]["logits"]["snr_db"] >= 36

    # the candidate after the passing one never ran: no quantization, no binary, no simulator run
    recs = records(out)
    assert s["candidates"][2]["note"] == "not run: w8a16-pc passed"
    assert recs["compile/auto.w16a16@SM8650"]["skipped"] and (work / "w16a16" / "auto_ctx_qnn.bin").stat().st_size == 0
    assert recs["verify/auto.w16a16@SM8650"]["result"] == {"skipped": True}
    assert recs["screen/auto.w16a16"]["result"] == {"skipped": True}
    # the failing candidate's verification stopped once its first samples proved it below 36 dB
    assert "early_stop" in s["candidates"][0] and s["candidates"][0]["worst"]["snr_db"] < 36

    manifest = json.loads((out / "manifest.json").read_text())
    arts = [a for a in manifest["artifacts"] if a["recipe"] == "auto"]
    assert {a["path"] for a in arts} == {"SM8650/auto/auto_ctx.onnx", "SM8650/auto/auto_ctx_qnn.bin"}
    for a in arts:
        ps = a["precision_search"]
        assert a["verification"]["status"] == "passed" and ps["winner"] == "w8a16-pc"
        for c in ps["candidates"][:2]:
            assert c["bin_size"] > 0 and c["total_seconds"] > 0
            assert all(c["seconds"][k] > 0 for k in ("quantize", "compile", "verify"))
    row = next(x for x in json.loads((out / "report.json").read_text())["rows"] if x["recipe"] == "auto")
    assert row["precision"] == "auto: w8a16-pc" and len(row["search"]["candidates"]) == 5
    html = (out / "report.html").read_text()
    assert "precision search" in html and "not run: w8a16-pc passed" in html

    r = ctxbuild("build", str(tree), "-o", str(out))  # a rebuild is a no-op
    assert r.code == 0 and last_build(out) == {}, r.text

    (tree / "auto.yaml").write_text(AUTO % 36.5)  # same decisions: no quantize, no compile runs
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert not {i for i in last_build(out) if i.startswith(("compile/", "quantize/"))}, last_build(out)
    assert _search(out)["winner"] == "w8a16-pc"

    (tree / "auto.yaml").write_text(AUTO % 50)  # a stricter threshold: only the newly needed candidate compiles
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert _compiled(out) == {"compile/auto.w16a16@SM8650"}
    s = _search(out)
    assert s["winner"] == "w16a16" and s["candidates"][0]["state"] == "rejected_cpu"
    assert s["candidates"][0]["note"].startswith("skipped: CPU screen 34.")

    (tree / "auto.yaml").write_text(AUTO % 36)  # back: every compile restores, none runs
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0 and _compiled(out) == set() and _search(out)["winner"] == "w8a16-pc", r.text

    # nothing passes: w8a16 and w8a16-pc are far below 80 dB on the CPU and never compile; fp16 (last) runs, and fails
    (tree / "auto.yaml").write_text(AUTO % 80)
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1, r.text
    assert _compiled(out) == {"compile/auto.mixed@SM8650", "compile/auto.fp16@SM8650"}  # mixed: diagnosed, then fp16
    line = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED select/auto@SM8650"))
    assert "no precision candidate meets" in line and "w8a16 skipped: CPU screen 34." in line
    for name, verdict in (("w8a16", "skipped: CPU screen"), ("w8a16-pc", "skipped: CPU screen"),
                          ("w16a16", "below threshold"), ("fp16", "below threshold")):
        assert any(ln.startswith(name + " ") and verdict in ln for ln in r.text.splitlines()), r.text
    assert not (out / "SM8650" / "auto" / "auto_ctx_qnn.bin").exists()
    assert records(out)["select/auto@SM8650"]["result"]["search"]["winner"] is None


def test_fresh_out_restores_the_search_from_the_cache(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, {"auto": AUTO % 36})
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "a"))
    assert r.code == 0, r.text
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "b"))
    assert r.code == 0, r.text
    ran = last_build(tmp_path / "b")
    assert ran and set(ran.values()) == {"cache"}, ran
    assert any(i.startswith("search_step/") for i in ran) and any(i.startswith("screen/") for i in ran)
    assert _search(tmp_path / "b") == _search(tmp_path / "a")


def test_ladder_in_the_recipe_and_candidates_an_arch_cannot_run(tree: Path, ctxbuild) -> None:
    _only(tree, {
        "custom": HEAD + "precision: auto\ntargets: [SM8650]\nquantization:\n"
                  "  - {name: cheap, activations: uint8}\n  - {weights: int16, calibration_method: percentile}\n",
        "refined": HEAD + "precision: auto\ntargets: [SM8350, SM8650]\nquantization: {samples: 4}\n",
    })
    r = ctxbuild("plan", str(tree), "--format", "json")
    assert r.code == 0, r.text
    acts = {a["id"]: a for a in json.loads(r.out)["actions"]}
    sel = acts["select/custom@SM8650"]["params"]
    assert [c["name"] for c in sel["candidates"]] == ["cheap", "w16a16-percentile", "mixed", "fp16"]
    assert sel["thresholds"] == {"min_cosine": 0.99, "min_snr_db": 20.0}
    assert "thresholds" not in acts["verify/custom.cheap@SM8650"]["params"]  # a threshold never recompiles
    assert "thresholds" not in acts["compile/custom.cheap@SM8650"]["params"]
    old = acts["select/refined@SM8350"]["params"]
    assert [c["name"] for c in old["candidates"]] == ["w8a16", "w8a16-pc", "mixed", "fp16"]  # v68: no int16 weights
    assert old["skipped"][0]["name"] == "w16a16" and "v73" in old["skipped"][0]["reason"]
    assert [c["name"] for c in acts["select/refined@SM8650"]["params"]["candidates"]] == [
        "w8a16", "w8a16-pc", "w16a16", "mixed", "fp16"]
    assert all(c["quantization"]["samples"] == 4 for c in old["candidates"][:-2])
    assert old["candidates"][-2] == {"name": "mixed", "precision": "mixed"}  # its settings: decided by culprits
    mixed_quantize = next(a for a in acts.values() if a["kind"] == "quantize" and "mixed" in a["description"]
                          and a["recipes"] == ["refined"])
    assert mixed_quantize["params"]["samples"] == 4  # calibrated as the candidates it is made from
    assert old["candidates"][-1] == {"name": "fp16", "precision": "fp16"}


def test_auto_refuses_bundles_and_disabled_verification(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, {"nov": HEAD + "precision: auto\ntargets: [SM8650]\nverify: false\n"})
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2 and "nov.yaml:6: precision: auto chooses by verification" in r.err, r.text


def test_identical_binary_reuses_simulator_outputs(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """tiny_cnn's int16 build and the auto search's w8a16 candidate compile to byte-identical binaries:
    the second verify restores the first one's simulator outputs, and computes identical metrics."""
    _only(tree, {"plain": HEAD + "precision: w8a16\ntargets: [SM8650]\n", "auto": AUTO % 20})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "-j1")
    assert r.code == 0, r.text
    recs = records(out)
    pair = [recs["verify/plain@SM8650"], recs["verify/auto.w8a16@SM8650"]]
    assert sorted("simulator" in v["memo_hits"] for v in pair) == [False, True]
    assert pair[0]["result"]["outputs"] == pair[1]["result"]["outputs"]

    (tree / "plain.yaml").write_text(HEAD + "precision: w8a16\ntargets: [SM8650]\nverify: {min_cosine: 0.995}\n")
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    again = records(out)["verify/plain@SM8650"]
    assert last_build(out) == {"verify/plain@SM8650": "run"} and again["memo_hits"] == ["original", "simulator"]
    assert again["result"]["outputs"] == pair[0]["result"]["outputs"]

    (tree / "plain.yaml").write_text(HEAD + "precision: w8a16\ntargets: [SM8650]\nverify: {min_cosine: 0.996}\n")
    r = ctxbuild("build", str(tree), "-o", str(out), env={"CTXBUILD_VERIFY_MEMO": "0"})
    assert r.code == 0, r.text
    fresh = records(out)["verify/plain@SM8650"]
    assert fresh["memo_hits"] == [] and fresh["result"]["outputs"] == pair[0]["result"]["outputs"]


MLP = "model: models/mlp.onnx\ncalibration: {dir: models/calib/mlp}\nprecision: auto\ntargets: [SM8650]\n"
# uint16 (asymmetric) weights on fc1: QNN refuses the FullyConnected (error 3110), measured with 2.7.0.
REFUSED = "  - {name: w1-uint16, tensors: {w1: {type: uint16}}}\n"


def test_candidate_qnn_will_not_compile_drops_out(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, {"auto": MLP + "quantization:\n" + REFUSED + "  - {name: plain}\n"})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    s = json.loads((out / "SM8650" / "auto" / "auto_search.json").read_text())
    refused, plain, _, fp16 = s["candidates"]
    assert s["winner"] == "plain" and plain["passed"] and not refused["passed"] and fp16["state"] == "not_run"
    assert "fc1" in refused["compile_refused"]["error"] and refused["bin_size"] is None, refused
    assert records(out)["compile/auto.w1-uint16@SM8650"]["compile_refused"]["error"] == refused["compile_refused"]["error"]
    assert "QNN would not compile it: QNN cannot run 1 node(s): fc1" in (out / "report.html").read_text()
    search = next(a for a in json.loads((out / "manifest.json").read_text())["artifacts"] if "precision_search" in a)
    assert all(c["seconds"]["compile"] > 0 for c in search["precision_search"]["candidates"])

    # Cached like any result, and every key is free of OUT paths: a fresh OUT restores all, the select too.
    fresh = tmp_path / "fresh"
    r = ctxbuild("build", str(tree), "-o", str(fresh))
    assert r.code == 0 and set(last_build(fresh).values()) == {"cache"}, r.text
    assert (fresh / "SM8650" / "auto" / "auto_search.json").read_bytes() == \
        (out / "SM8650" / "auto" / "auto_search.json").read_bytes()

    # nothing else on the ladder (fp16 left out: it passes on the MLP): the build fails
    _only(tree, {"auto": MLP + "auto: {fp16: false}\nquantization:\n" + REFUSED})
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1, r.text
    assert "no precision candidate meets" in r.err and "w1-uint16 did not compile (QNN cannot run" in r.err, r.err


def test_no_winner_names_the_failing_slice_not_the_whole_output() -> None:
    """The figures of issue 19 item 6: the whole output passes (0.9965, 21.5 dB), its score slice does not."""
    from ctxbuild.actions.select import measured_row, no_winner, table

    thr = {"min_cosine": 0.99, "min_snr_db": 20.0}
    res = {"outputs": {"output0": {
        "cosine": 0.9965, "snr_db": 21.5, "argmax_agreement": 1.0,
        "slices": [{"slice": "boxes", "start": 0, "stop": 4, "axis": 1, "range": 320.0, "cosine": 0.9999, "snr_db": 40.2},
                   {"slice": "scores", "start": 4, "stop": 84, "axis": 1, "range": 1.0, "cosine": 0.61, "snr_db": 1.5}]}}}
    row = {"name": "w8a16", "quantization": {}, **measured_row(res, thr), "bin_size": 10}
    search = {"thresholds": thr, "winner": None, "candidates": [row], "skipped": []}
    err = no_winner("SM8650", search)
    assert "SNR 1.5 dB (output 'output0' slice 4:84 (scores))" in err.message, err.message
    assert "21.5" not in err.message and "split_outputs" in err.hint
    assert "1.5" in table(search) and "slice 4:84" in table(search)


def test_candidate_rejected_on_cpu_never_compiles(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """At 42 dB w8a16's and w8a16-pc's QDQ models read 34.4 and 36.3 dB on the CPU EP: more than the 2.5 dB
    margin short, skipped before compiling; w16a16 gets its simulator run and wins."""
    _only(tree, {"auto": AUTO % 42})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    s = _search(out)
    assert [c["state"] for c in s["candidates"]] == ["rejected_cpu", "rejected_cpu", "passed", "not_run", "not_run"]
    assert s["candidates"][0]["note"] == ("skipped: CPU screen 34.4 dB, cosine 0.9998 at output 'logits' < 42 dB, "
                                          "0.99 - 2.5 dB margin") and s["candidates"][0]["bin_size"] is None
    recs = records(out)
    assert recs["compile/auto.w8a16@SM8650"]["skipped"] and recs["verify/auto.w8a16@SM8650"]["result"] == {"skipped": True}
    assert _compiled(out) == {"compile/auto.w16a16@SM8650"}
    assert "skipped: CPU screen 36.3 dB" in (out / "report.html").read_text()


def test_hopeless_search_stops_at_the_first_refusal(tree: Path, tmp_path: Path, ctxbuild) -> None:
    onnx.save(matmul_nonzero_model(), tree / "models" / "nz.onnx")
    _only(tree, {"nz": "model: models/nz.onnx\ncalibration: {random: true}\nprecision: auto\ntargets: [SM8650]\n"})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1, r.text
    search = records(out)["select/nz@SM8650"]["result"]["search"]
    assert [c["state"] for c in search["candidates"]] == ["refused", "not_run", "not_run", "not_run", "not_run"]
    assert search["candidates"][1]["note"] == "not run: the search stopped at w8a16: QNN cannot run NonZero at any precision"
    recs = records(out)
    assert all(recs[f"compile/nz.{c}@SM8650"]["skipped"] for c in ("w8a16-pc", "w16a16", "mixed", "fp16"))
    assert _compiled(out) == {"compile/nz.w8a16@SM8650"}
    line = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED select/nz@SM8650"))
    assert "compile.cpu_fallback: true" in line, line


def test_a_later_target_skips_what_an_earlier_one_measured_failing(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """Two SoCs: SM8650 measures w8a16 failing (34.4 dB < 36) and w8a16-pc passing; SM8750 skips w8a16 on that
    measurement (never compiled), verifies w8a16-pc itself and agrees. `auto: {siblings: false}` plans each
    target on its own."""
    body = HEAD + "precision: auto\ntargets: [SM8650, SM8750]\nverify: {min_snr_db: 36}\nauto: {mixed: false, fp16: false}\n"
    _only(tree, {"auto": body})
    r = ctxbuild("plan", str(tree), "--format", "json")
    acts = {a["id"]: a for a in json.loads(r.out)["actions"]}
    admit = acts["search_step/auto.w8a16-pc@SM8750"]
    assert admit["params"]["siblings"] == {"SM8750": ["SM8650"]}
    assert {"verify.SM8650.w8a16", "verify.SM8650.w8a16-pc"} <= set(admit["inputs"])
    assert acts["select/auto@SM8750"]["params"]["siblings"] == ["SM8650"]
    # what ships is the search's own verify of it on that SoC, never verified again: each select reads its
    # candidates' verifies on its target, and no verify reads a select's outputs
    for t in ("SM8650", "SM8750"):
        sel = acts[f"select/auto@{t}"]
        for n in ("w8a16", "w8a16-pc", "w16a16"):
            assert sel["inputs"][f"{n}.result"] == acts[f"verify/auto.{n}@{t}"]["outputs"]["result"]
    shipped = {p for t in ("SM8650", "SM8750") for p in acts[f"select/auto@{t}"]["outputs"].values()}
    assert not [a["id"] for a in acts.values() if a["kind"] == "verify" and shipped & set(a["inputs"].values())]
    assert sum(a["kind"] == "verify" for a in acts.values()) == 6  # 3 candidates x 2 targets

    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert _compiled(out) == {"compile/auto.w8a16@SM8650", "compile/auto.w8a16-pc@SM8650", "compile/auto.w8a16-pc@SM8750"}
    first = json.loads((out / "SM8650" / "auto" / "auto_search.json").read_text())
    second = json.loads((out / "SM8750" / "auto" / "auto_search.json").read_text())
    assert [c["state"] for c in first["candidates"]] == ["failed", "passed", "not_run"]
    assert [c["state"] for c in second["candidates"]] == ["predicted_fail", "passed", "not_run"]
    skipped = second["candidates"][0]
    assert skipped["predicted_by"] == "SM8650" and skipped["note"].startswith("skipped: failed on SM8650's simulator")
    assert "disagrees" not in second["candidates"][1] and first["winner"] == second["winner"] == "w8a16-pc"
    assert records(out)["verify/auto.w8a16@SM8750"]["result"] == {"skipped": True}
    assert "ctxbuild: auto@SM8750: not compiled, failed on a sibling SoC's simulator: w8a16 (SM8650's measurement)" \
        in r.out.splitlines()  # the summary
    row = next(x for x in json.loads((out / "report.json").read_text())["rows"]
               if x["recipe"] == "auto" and x["target"]["name"] == "SM8750")
    assert row["search"]["candidates"][0]["predicted_by"] == "SM8650"
    assert "(predicted from SM8650" in (out / "report.html").read_text()
    # bench/search_bench.py's counting mode over this build: this tree walked over its own measurements runs the
    # same 3 simulator runs for the same seconds and winners; saved figures replay the same without the OUT
    from bench.search_bench import recorded, replay

    figures = recorded(out, [])
    again = replay(figures)
    assert again["verify_actions"] == {"base": 3, "this tree": 3} and again["simulator_s"]["ratio"] == 1.0
    assert again["same_winners"] and again["winners"] == {"select/auto@SM8650": "w8a16-pc", "select/auto@SM8750": "w8a16-pc"}
    assert replay(json.loads(json.dumps(figures))) == again
    alone = replay(figures, sibling_rule=False)  # SM8750 on its own would measure w8a16, which this build never did
    assert alone["missing"] == ["select/auto@SM8750"]
    assert alone["targets"]["select/auto@SM8750"]["missing"] == "simulator run of w8a16"

    (tree / "auto.yaml").write_text(body.replace("mixed: false", "mixed: false, siblings: false"))
    r = ctxbuild("plan", str(tree), "--format", "json")
    acts = {a["id"]: a for a in json.loads(r.out)["actions"]}
    assert acts["search_step/auto.w8a16-pc@SM8750"]["params"]["siblings"] == {}
    assert not any(k.startswith("verify.SM8650.") for k in acts["search_step/auto.w8a16-pc@SM8750"]["inputs"])
