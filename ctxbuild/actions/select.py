"""select: the precision search's decision for one target. Reads every candidate's measured verification,
picks the first (in ladder order) that meets the thresholds, and places its `_ctx.onnx`/`.bin` at the normal
output paths, with `<recipe>_verify.json` (the winner's metrics) and `<recipe>_search.json` (every candidate).
Its only parameters besides the ladder are the thresholds: changing them re-decides without recompiling."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild.errors import ActionError
from ctxbuild.actions.compile import partition_names
from ctxbuild.verify.measure import failures


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text()),
            "search": json.loads(Path(action.outputs["search"]).read_text()),
            "graph_names": partition_names(action)}


def run(ctx: Any) -> None:
    a = ctx.action
    thr = a.params["thresholds"]
    rows, results = [], {}
    for c in a.params["candidates"]:
        name = c["name"]
        res = json.loads(Path(a.inputs[f"{name}.result"]).read_text())
        results[name] = res
        row = {"name": name, "quantization": c["quantization"]}
        if refused := res.get("compile_refused"):  # dropped out: QNN would not compile this candidate
            rows.append({**row, "passed": False, "failures": [f"QNN would not compile it: {refused['error']}"],
                         "compile_refused": refused, "bin_size": None, "outputs": {}})
            continue
        why = failures({**res, "thresholds": thr})
        binary = Path(a.inputs.get(f"{name}.bin") or a.inputs[f"{name}.ctx"])
        rows.append({**row, "passed": not why, "failures": why, "bin_size": binary.stat().st_size,
                     "outputs": {o: {k: m[k] for k in ("cosine", "snr_db", "argmax_agreement")}
                                 for o, m in res["outputs"].items()}})
    winner = next((r["name"] for r in rows if r["passed"]), None)
    search = {"thresholds": thr, "winner": winner, "candidates": rows, "skipped": a.params["skipped"]}
    ctx.tmp_output("search").write_text(json.dumps(search, indent=2, sort_keys=True))
    if winner is None:
        print(table(search))
        raise ActionError(f"{a.target['name']}: no quantization candidate meets min cosine {thr['min_cosine']} / "
                          f"min SNR {thr['min_snr_db']} dB: " + "; ".join(
                              f"{r['name']} {_worst(r)}" for r in rows), details={"passed": False, "search": search},
                          hint="add a stronger candidate (weights: int16, per-node overrides) to the ladder, "
                          "or lower verify.min_cosine/min_snr_db if the model tolerates it")
    shutil.copyfile(a.inputs[f"{winner}.ctx"], ctx.tmp_output("ctx"))
    if "bin" in a.outputs:
        shutil.copyfile(a.inputs[f"{winner}.bin"], ctx.tmp_output("bin"))
    result = {**results[winner], "thresholds": thr, "passed": True, "candidate": winner,
              "method": f"direct (precision search: {winner})"}
    ctx.tmp_output("result").write_text(json.dumps(result, indent=2, sort_keys=True))


def _worst(row: dict[str, Any]) -> str:
    """The worst output's figures: `cosine 0.8432, SNR 6.1 dB`, or why there are none."""
    if refused := row.get("compile_refused"):
        return f"did not compile ({refused['error']})"
    cos = min(m["cosine"] for m in row["outputs"].values())
    snr = min(m["snr_db"] for m in row["outputs"].values())
    return f"cosine {cos:.6f}, SNR {snr:.1f} dB"


def table(search: dict[str, Any]) -> str:
    """The candidate table as text (the log and the console on failure)."""
    lines = [f"{'candidate':<20} {'cosine':>9} {'SNR dB':>8} {'bin bytes':>11}  result"]
    for r in search["candidates"]:
        if refused := r.get("compile_refused"):
            lines.append(f"{r['name']:<20} {'':>9} {'':>8} {'':>11}  did not compile: {refused['error']}")
            continue
        cos = min(m["cosine"] for m in r["outputs"].values())
        snr = min(m["snr_db"] for m in r["outputs"].values())
        verdict = "WINNER" if r["name"] == search["winner"] else ("pass" if r["passed"] else "below threshold")
        lines.append(f"{r['name']:<20} {cos:>9.6f} {snr:>8.1f} {r['bin_size']:>11}  {verdict}")
    lines += [f"{s['name']:<20} {'':>9} {'':>8} {'':>11}  skipped: {s['reason']}" for s in search["skipped"]]
    return "\n".join(lines)
