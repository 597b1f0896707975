"""What a build prints: the closing summary (counts, accuracy per graph per target, report path), --json,
-q, -C, each failure once without internal command lines, no escape codes under NO_COLOR."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import keep_only


def _one_recipe(tree: Path, verify: str = "") -> None:
    keep_only(tree, "tiny_cnn_int8.yaml")
    if verify:
        p = tree / "tiny_cnn_int8.yaml"
        p.write_text(p.read_text() + verify)


def test_summary_ends_with_accuracy_and_report(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _one_recipe(tree)
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    lines = r.out.splitlines()
    assert lines[-1] == f"ctxbuild: report: {out / 'report.html'}"
    assert re.fullmatch(r"ctxbuild: 4 built, 0 restored, 0 failed in [\d.]+ s", lines[-4]), lines
    verify = json.loads((out / "SM8650" / "tiny_cnn_int8" / "tiny_cnn_int8_verify.json").read_text())
    worst = min(o["snr_db"] for o in verify["outputs"].values())
    assert re.fullmatch(r"  recipe\s+checked\s+target\s+cosine\s+SNR dB  verdict", lines[-3]), lines
    assert re.fullmatch(rf"  tiny_cnn_int8  tiny_cnn_int8  SM8650\s+0\.\d{{4}}\s+{worst:.1f}  ok", lines[-2]), lines

    r = ctxbuild("build", str(tree), "-o", str(out))  # a no-op still answers
    assert r.code == 0 and "ctxbuild: up to date" in r.out and r.out.splitlines()[-1].endswith("report.html")
    r = ctxbuild("build", "-q", str(tree), "-o", str(out))
    assert r.code == 0 and r.out == "" and r.err == ""


def test_json_document_and_dash_C(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _one_recipe(tree)
    (tmp_path / "elsewhere").mkdir()
    # -C: paths on the command line are relative to DIR, as with make -C
    r = ctxbuild("-C", str(tmp_path), "build", "--json", "recipes", "-o", "out", cwd=tmp_path / "elsewhere")
    assert r.code == 0, r.text
    doc = json.loads(r.out)  # stdout is exactly one JSON document; progress went to stderr
    assert doc["ok"] and doc["actions"] == {"built": 4, "restored": 0, "failed": 0}
    assert doc["report"] == str(tmp_path / "out" / "report.html") and (tmp_path / "out" / "report.html").is_file()
    [acc] = doc["accuracy"]
    assert acc["graph"] == "tiny_cnn_int8" and acc["target"] == "SM8650" and acc["passed"]
    assert 0.99 < acc["cosine"] <= 1 and acc["snr_db"] > 20
    assert {a["path"] for a in doc["artifacts"]} >= {"SM8650/tiny_cnn_int8/tiny_cnn_int8_ctx.onnx"}
    assert "[1/" in r.err and not (tmp_path / "elsewhere" / "out").exists()


def test_failure_once_without_internal_commands_or_colour(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _one_recipe(tree, "verify: {min_snr_db: 100}\n")
    out = tmp_path / "out"
    env = {"NO_COLOR": "1", "CLICOLOR_FORCE": "1"}  # ninja 1.13 colours FAILED: with CLICOLOR_FORCE
    r = ctxbuild("build", "--json", str(tree), "-o", str(out), env=env)
    assert r.code == 1
    assert "\x1b" not in r.text and "client.py" not in r.text and "FAILED:" not in r.text
    assert r.err.count("SNR 3") == 1 and r.err.count("ctxbuild: FAILED verify/tiny_cnn_int8@SM8650") == 1
    doc = json.loads(r.out)
    assert not doc["ok"] and doc["exit_code"] == 1 and doc["actions"]["failed"] == 1
    assert [f["id"] for f in doc["failures"]] == ["verify/tiny_cnn_int8@SM8650"]
    assert doc["accuracy"][0]["passed"] is False

    r = ctxbuild("build", str(tree), "-o", str(out), env=env)  # the summary says which graph failed and why
    assert r.code == 1 and "FAILED (min cosine 0.95, min SNR 100 dB)" in r.out and "\x1b" not in r.text
    r = ctxbuild("verify", "--layers", "tiny_cnn_int8", str(tree), "-o", str(out), env=env)
    assert r.code == 1 and r.err.count("FAILED verify/tiny_cnn_int8@SM8650") == 1, r.text
    assert "worst in quantization" in r.out and "report:" not in r.out  # the diagnosis, not the summary


def test_summary_lists_each_verification_once_by_recipe() -> None:
    """An LLM's token check serves every part and the genai config: one summary row, naming the recipe and its
    context lengths (make build once ended with nine look-alike `tokens  SM8650` rows)."""
    from ctxbuild.outputs import summary

    tokens = {"id": "llm_eval/chat@SM8650", "graph": "tokens", "adapter": None, "context_lengths": [64, 128],
              "status": "built", "passed": True, "outputs": [{"cosine": 0.999, "snr_db": 27.4}], "thresholds": {}}
    target = {"name": "SM8650"}
    rows = [{"recipe": "chat", "target": target, "verify": [tokens]} for _ in range(3)]
    rows.append({"recipe": "other", "target": target, "verify": [{**tokens, "id": "llm_eval/other@SM8650"}]})
    acc = summary.accuracy(rows)
    assert [(a["recipe"], a["graph"]) for a in acc] == [("chat", "tokens"), ("other", "tokens")]
    doc = {"actions": {"built": 1, "restored": 0, "failed": 0}, "up_to_date": False, "wall_seconds": 1.0,
           "accuracy": acc, "artifacts": [], "report": "out/report.html"}
    lines = summary.text(doc)
    assert lines[2].split() == ["chat", "tokens", "CL", "64,128", "SM8650", "0.9990", "27.4", "ok"]
    assert lines[3].split()[0] == "other" and len(lines) == 5


def test_a_rows_figures_are_its_worst_part_and_a_search_names_its_answer() -> None:
    """NudeNet's YOLOv8 with split_outputs failed verification on its scores slice (0.43 / 0.8 dB) while the row
    showed the whole output, 0.9955 / 20.5 dB, above both thresholds, and said FAILED. The row takes the worst
    part, and names it."""
    from ctxbuild.outputs import summary

    v = {"id": "verify/det@SM8650", "graph": "det", "status": "failed", "passed": False,
         "thresholds": {"min_cosine": 0.99, "min_snr_db": 20.0},
         "outputs": [{"name": "output0", "cosine": 0.995516, "snr_db": 20.483, "slices": [
             {"range": "0:4", "cosine": 0.995516, "snr_db": 20.483},
             {"range": "4:22", "cosine": 0.433787, "snr_db": 0.85}]}]}
    [acc] = summary.accuracy([{"recipe": "det", "target": {"name": "SM8650"}, "verify": [v]}])
    assert (acc["cosine"], acc["snr_db"], acc["worst"]) == (0.433787, 0.85, "output0 slice 4:22"), acc
    doc = {"actions": {"built": 1, "restored": 0, "failed": 1}, "up_to_date": False, "wall_seconds": 1.0,
           "accuracy": [acc], "artifacts": [], "report": "out/report.html"}
    assert summary.text(doc)[2].split(None, 5)[3:] == [
        "0.4338", "0.8", "FAILED at output0 slice 4:22 (min cosine 0.99, min SNR 20.0 dB)"]

    # a precision search's row says what it ships (the console said nothing of it: only <recipe>_search.json did)
    v = {**v, "passed": True, "outputs": v["outputs"][:1]}
    v["outputs"][0] = {k: x for k, x in v["outputs"][0].items() if k != "slices"}
    [acc] = summary.accuracy([{"recipe": "det", "target": {"name": "SM8650"}, "verify": [v],
                               "precision": "auto: w8a16-pc"}])
    assert summary.text({**doc, "accuracy": [acc]})[2].split(None, 5)[5] == "ok (auto: w8a16-pc)"


def test_a_cache_warning_is_said_once(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """An unusable local cache is one warning for the build, not one per action (24 lines in one build before),
    and the build goes on without it."""
    _one_recipe(tree)
    (tmp_path / "not-a-dir").write_text("")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), env={"CTXBUILD_CACHE_DIR": str(tmp_path / "not-a-dir")})
    assert r.code == 0, r.text
    lines = [ln for ln in r.err.splitlines() if "local cache" in ln and "unavailable" in ln]
    assert len(lines) == 1, r.err


def test_bad_out_and_inspect_paths_are_usage_lines(tmp_path: Path, ctxbuild) -> None:
    (tmp_path / "afile").write_text("")
    r = ctxbuild("build", "-o", str(tmp_path / "afile"))
    assert r.code == 2 and "is a file, not an output directory" in r.err and len(r.err.strip().splitlines()) == 1
    r = ctxbuild("inspect", str(tmp_path))
    assert "a directory (give a context binary (.bin) or an EPContext model (_ctx.onnx))" in r.err, r.text
