"""precision: auto's last rung: fp16, run only when no integer candidate passed, left out with `auto: {fp16: false}`."""
from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import TINY_CNN, last_build, records
from tests.e2e.test_search import AUTO, _compiled, _only, _search


def _log_model(d: Path, named: bool = True) -> None:
    """y = log(1.5 x) on inputs spread log-uniformly over 1e-4..1e2: one 16-bit integer scale (zero included)
    cannot hold the small values whose logs are half the output; fp16 keeps ~3 digits at every magnitude.
    `named`: False leaves the nodes without names (ONNX allows it; quantization.nodes names them by output)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k = numpy_helper.from_array(np.full((1, 64), 1.5, np.float32), "k")
    nodes = [helper.make_node("Mul", ["x", "k"], ["h"], name="scale" if named else ""),
             helper.make_node("Log", ["h"], ["y"], name="log" if named else "")]
    g = helper.make_graph(nodes, "logs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [k])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), d / "logs.onnx")
    rng = np.random.default_rng(0)
    (d / "calib" / "logs").mkdir(parents=True)
    for i in range(8):
        x = (10.0 ** rng.uniform(-4, 2, (1, 64))).astype(np.float32)
        np.savez(d / "calib" / "logs" / f"sample_{i:03}.npz", x=x)


LOGS = ("model: models/logs.onnx\ninputs: {x: [1, 64]}\ncalibration: {dir: models/calib/logs}\nprecision: auto\n"
        "targets: [SM8650]\nverify: {min_snr_db: 40}\n")


def test_auto_ends_at_fp16_when_every_integer_candidate_fails(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _log_model(tree / "models")
    _only(tree, {"logs": LOGS})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    s = json.loads((out / "SM8650" / "logs" / "logs_search.json").read_text())
    assert [(c["name"], c["state"]) for c in s["candidates"]] == [
        ("w8a16", "rejected_cpu"), ("w8a16-pc", "rejected_cpu"), ("w16a16", "rejected_cpu"),
        ("mixed", "rejected_cpu"), ("fp16", "passed")]  # mixed: diagnosed, quantized, rejected on the CPU too
    fp16 = s["candidates"][4]
    assert s["winner"] == "fp16" and fp16["precision"] == "fp16" and "quantization" not in fp16
    assert fp16["worst"]["snr_db"] >= 40 and fp16["bin_size"] > 0
    assert _compiled(out) == {"compile/logs.fp16@SM8650"}  # the integer candidates never compiled
    plan = {a["id"]: a for a in json.loads(ctxbuild("plan", str(tree), "--format", "json").out)["actions"]}
    assert plan["compile/logs.fp16@SM8650"]["params"]["provider_options"]["enable_htp_fp16_precision"] == "1"
    assert plan["compile/logs.fp16@SM8650"]["inputs"]["model"] == plan["verify/logs.fp16@SM8650"]["inputs"]["reference"]
    assert not any(i.startswith(("quantize/", "screen/")) and "fp16" in i for i in plan)  # the prepared model
    verdict = json.loads((out / "SM8650" / "logs" / "logs_verify.json").read_text())
    assert verdict["passed"] and verdict["candidate"] == "fp16"
    ps = next(a for a in json.loads((out / "manifest.json").read_text())["artifacts"] if "precision_search" in a)
    row = ps["precision_search"]["candidates"][4]
    assert row["winner"] and set(row["seconds"]) == {"compile", "verify"} and row["total_seconds"] > 0
    log = (out / ".ctxbuild" / "logs" / "select.logs@SM8650.log").read_text()
    assert any(ln.startswith("fp16 ") and ln.endswith("WINNER") for ln in log.splitlines()), log
    row = next(x for x in json.loads((out / "report.json").read_text())["rows"] if x["recipe"] == "logs")
    assert row["precision"] == "auto: fp16" and len(row["search"]["candidates"]) == 5

    _only(tree, {"logs": LOGS + "auto: {fp16: false}\n"})  # integer candidates only: nothing passes
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1, r.text
    assert _compiled(out) == set()
    line = next(ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED select/logs@SM8650"))
    assert "no precision candidate meets" in line and "; fp16 " not in line, line
    assert "remove `auto: {fp16: false}` to let the search try fp16" in line, line


def test_fp16_gate_stays_closed_when_an_integer_candidate_passes(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, {"auto": AUTO % 20})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    s = _search(out)
    assert [(c["name"], c["state"]) for c in s["candidates"]][::4] == [("w8a16", "passed"), ("fp16", "not_run")]
    assert s["candidates"][4]["note"] == s["candidates"][3]["note"] == "not run: w8a16 passed"
    recs = records(out)
    gate = out / ".ctxbuild" / "work" / "search" / "SM8650" / "auto" / "fp16" / "admit.json"
    assert recs["search_step/auto.fp16@SM8650"]["outputs"]["gate"]["path"] == str(gate.relative_to(out))
    assert json.loads(gate.read_text()) == {"run": False}
    assert recs["compile/auto.fp16@SM8650"]["skipped"] and recs["verify/auto.fp16@SM8650"]["result"] == {"skipped": True}
    assert _compiled(out) == {"compile/auto.w8a16@SM8650"} and last_build(out)["compile/auto.fp16@SM8650"] == "run"


def test_auto_field_needs_precision_auto(tree: Path, tmp_path: Path, ctxbuild) -> None:
    _only(tree, {"plain": TINY_CNN + "precision: fp16\n"
                          "targets: [SM8650]\nauto: {fp16: false}\n"})
    r = ctxbuild("plan", str(tree))
    assert r.code == 2 and "plain.yaml:5: `auto` has no effect with precision fp16" in r.err, r.text


def test_nodes_without_names_reach_the_mixed_rung_by_their_outputs(tmp_path: Path, ctxbuild) -> None:
    """Every integer candidate fails on the CPU, on a model whose nodes have no names: the mixed rung's diagnosis
    blames them by their first outputs, which quantization.nodes takes (graph/nodenames.key), so the mixed
    candidate is quantized and measured (rejected on the CPU, as on the named model) and fp16 passes. (Before, the
    diagnosis could not name them and closed the mixed rung's gate: not run, diagnosis_failed.)"""
    tree = tmp_path / "recipes"
    tree.mkdir()
    _log_model(tree, named=False)
    (tree / "logs.yaml").write_text(LOGS.replace("models/", ""))
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    s = json.loads((out / "SM8650" / "logs" / "logs_search.json").read_text())
    assert [(c["name"], c["state"]) for c in s["candidates"]] == [
        ("w8a16", "rejected_cpu"), ("w8a16-pc", "rejected_cpu"), ("w16a16", "rejected_cpu"),
        ("mixed", "rejected_cpu"), ("fp16", "passed")]
    mixed = s["candidates"][3]
    assert mixed["blamed"] and set(mixed["quantization"]["nodes"]) <= {"h", "y"}, mixed  # the Mul's, the Log's
    assert "diagnosis_failed" not in mixed and s["winner"] == "fp16"
