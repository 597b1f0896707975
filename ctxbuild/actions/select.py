"""select: the precision search's decision for one target. Walks the ladder over every candidate's CPU screen
and verification (verify/ladder.py, the walk the search's gates made), picks the first that meets the thresholds, and places its `_ctx.onnx`/`.bin` at the normal
output paths, with `<recipe>_verify.json` (the winner's metrics) and `<recipe>_search.json` (every candidate).
Its only parameters besides the ladder are the thresholds: changing them re-decides without recompiling.
A candidate skipped on a sibling SoC's measurement names that SoC in its row (`predicted_by`); when this
target's own run contradicts a sibling's (`disagrees`), the build warns and names what was skipped."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild.errors import ActionError
from ctxbuild.actions.search_step import known
from ctxbuild.actions.compile import partition_names
from ctxbuild.recipes.quantization import FP16_RUNG, MIXED_RUNG, settings as quantization_settings
from ctxbuild.verify.ladder import walk
from ctxbuild.verify.measure import failures


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text()),
            "search": json.loads(Path(action.outputs["search"]).read_text()),
            "graph_names": partition_names(action)}


def run(ctx: Any) -> None:
    a = ctx.action
    thr = a.params["thresholds"]
    names = [c["name"] for c in a.params["candidates"]]
    read = {n: json.loads(Path(a.inputs[f"{n}.result"]).read_text()) for n in names}
    screens = {n: json.loads(Path(a.inputs[f"{n}.screen"]).read_text()) for n in names if f"{n}.screen" in a.inputs}
    siblings = {s: known(a.inputs, f"sibling.{s}.", names) for s in a.params["siblings"]}
    walked = {r["name"]: r for r in walk(names, screens, read, thr, a.params["predict"], siblings)}
    rows = []
    for c in a.params["candidates"]:
        name, res, step = c["name"], read[c["name"]], walked[c["name"]]
        row = {"name": name, **{k: c[k] for k in ("quantization", "precision") if k in c}, "state": step["state"],
               **decided(a.inputs, name), **{k: step[k] for k in ("predicted_by", "disagrees") if k in step}}
        if step["state"] in ("rejected_cpu", "predicted_fail", "not_run"):  # never compiled: the walk says why
            why = row.get("diagnosis_failed") or step["why"]  # the mixed rung's gate closed on a failed diagnosis
            rows.append({**row, "passed": False, "failures": [why], "note": why, "bin_size": None,
                         "outputs": {}, **({"cpu_screen": screens[name]["outputs"]} if step["state"] == "rejected_cpu" else {})})
            continue
        if refused := res.get("compile_refused"):  # dropped out: QNN would not compile this candidate
            rows.append({**row, "passed": False, "failures": [f"QNN would not compile it: {refused['error']}"],
                         "compile_refused": refused, "bin_size": None, "outputs": {}})
            continue
        binary = Path(a.inputs.get(f"{name}.bin") or a.inputs[f"{name}.ctx"])
        rows.append({**row, **measured_row(res, thr), "bin_size": binary.stat().st_size,
                     **({"early_stop": res["early_stop"]} if "early_stop" in res else {})})
    winner = next((r["name"] for r in rows if r["passed"]), None)
    search = {"thresholds": thr, "winner": winner, "candidates": rows, "skipped": a.params["skipped"]}
    if winner is not None:
        search["pin"] = pin(next(r for r in rows if r["name"] == winner))
    ctx.tmp_output("search").write_text(json.dumps(search, indent=2, sort_keys=True))
    print(table(search))
    if winner is None:
        raise no_winner(a.target["name"], search)
    shutil.copyfile(a.inputs[f"{winner}.ctx"], ctx.tmp_output("ctx"))
    if "bin" in a.outputs:
        shutil.copyfile(a.inputs[f"{winner}.bin"], ctx.tmp_output("bin"))
    result = {**read[winner], "thresholds": thr, "passed": True, "candidate": winner,
              "method": f"direct (precision search: {winner})"}
    ctx.tmp_output("result").write_text(json.dumps(result, indent=2, sort_keys=True))


def warnings(action: Action) -> list[str]:
    """A sibling SoC's measurement contradicted here: the candidates skipped on it were not verified on this one."""
    search = json.loads(Path(action.outputs["search"]).read_text())
    rows = search["candidates"]
    odd = next((r for r in rows if r.get("disagrees")), None)
    skipped = {r["name"]: r["predicted_by"] for r in rows if r.get("predicted_by")}
    if odd is None or not skipped:
        return []
    t = action.target["name"]
    return [f"{action.description}: {odd['disagrees']}: the SoCs' simulators differ on this model; "
            + ", ".join(f"{n} (skipped on {soc}'s measurement)" for n, soc in skipped.items())
            + f" not verified on {t}; `auto: {{siblings: false}}` searches {t} on its own"]


def decided(inputs: dict[str, str], name: str) -> dict[str, Any]:
    """The mixed rung's settings, what the diagnosis blamed and the growing rounds on the CPU, as its culprits
    action decided them (or why its diagnosis failed)."""
    if f"{name}.settings" not in inputs:
        return {}
    d = json.loads(Path(inputs[f"{name}.settings"]).read_text())
    return {k: d[k] for k in ("quantization", "base", "blamed", "where", "rounds", "stopped", "diagnosis_failed",
                              "htp_only") if k in d}


def pin(row: dict[str, Any]) -> str:
    """The recipe lines that build the winner again without the search: a one-rung ladder (its compile and
    verify keep their action keys, so a build of the pinned recipe restores them from the cache)."""
    import yaml

    if row.get("precision") == "fp16":
        return "precision: fp16\n"
    default = quantization_settings({})
    s = {k: v for k, v in row["quantization"].items() if k == "nodes" and v or k != "nodes" and v != default.get(k)}
    return yaml.safe_dump({"precision": "auto", "quantization": [s], "auto": {"mixed": False, "fp16": False}},
                          sort_keys=False, width=200)


def measured_row(res: dict[str, Any], thr: dict[str, float]) -> dict[str, Any]:
    """A verified candidate's row: verdict, failures, per-output figures and the worst figures, slices
    included (a score slice at 1.5 dB fails the candidate while the whole output reads 21 dB)."""
    why = failures({**res, "thresholds": thr})
    parts = [(m["cosine"], m["snr_db"], f"output '{o}'") for o, m in res["outputs"].items()]
    parts += [(s["cosine"], s["snr_db"], f"output '{o}' slice {s['start']}:{s['stop']} ({s['slice']})")
              for o, m in res["outputs"].items() for s in m.get("slices") or []]
    worst = min(parts, key=lambda p: p[1])
    return {"passed": not why, "failures": why,
            "worst": {"cosine": min(p[0] for p in parts), "snr_db": worst[1], "where": worst[2]},
            "outputs": {o: {k: m[k] for k in ("cosine", "snr_db", "argmax_agreement")}
                        for o, m in res["outputs"].items()}}


def no_winner(target: str, search: dict[str, Any]) -> ActionError:
    """The failure naming each candidate's worst figures (a failing slice's, not its whole output's)."""
    rows, thr = search["candidates"], search["thresholds"]
    sliced = any("slice" in r.get("worst", {}).get("where", "") and not r["passed"] for r in rows)
    hint = ("add a stronger candidate (weights: int16, per-node overrides) to the ladder, "
            "or lower verify.min_cosine/min_snr_db if the model tolerates it")
    left = [rung["name"] for rung in (MIXED_RUNG, FP16_RUNG)  # left out by the recipe (`auto: {...: false}`)
            if not any(r.get("precision") == rung["precision"] for r in rows)]
    if left:
        what = {"mixed": "the mixed rung", "fp16": "fp16", "mixed fp16": "the mixed and fp16 rungs"}[" ".join(left)]
        hint = f"remove `auto: {{{', '.join(f'{n}: false' for n in left)}}}` to let the search try {what}; or " + hint
    if any("no static quantization of this export" in r.get("note", "") for r in rows):  # actions/quantize.py
        hint = ("point the recipe's `model:` at the float model the export was quantized from, or set "
                "compile.cpu_fallback: true to run what QNN refuses on the CPU")
    elif stopped := next((r["note"] for r in rows if r.get("state") == "not_run" and "stopped" in r["note"]), None):
        split = next((r["compile_refused"]["split"] for r in rows if "split" in r.get("compile_refused", {})), None)
        hint = (f"{stopped.removeprefix('not run: the search stopped at ')}: "
                + (f"{split}; or" if split else "rewrite those nodes in the model, or")
                + " set compile.cpu_fallback: true to run them on the CPU")
    elif htp := next((r["htp_only"] for r in rows if r.get("htp_only")), None):  # the mixed rung's diagnosis
        hint = f"{htp}; or {hint}"
    elif sliced:
        hint = ("a slice of a concatenated output fails: compile.split_outputs: true gives each part its own scale "
                "(as a search dimension: put it in the recipe and every candidate compiles split); or " + hint)
    return ActionError(f"{target}: no precision candidate meets min cosine {thr['min_cosine']} / min SNR "
                       f"{thr['min_snr_db']} dB: " + "; ".join(f"{', '.join(names)} {why}" for why, names in
                                                                _by_reason(rows).items()),
                       details={"passed": False, "search": search}, hint=hint)


def _by_reason(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Candidates grouped by their worst figures or reason, in ladder order: a reason several share (an export no
    candidate can quantize) is said once."""
    grouped: dict[str, list[str]] = {}
    for r in rows:
        grouped.setdefault(_worst(r), []).append(r["name"])
    return grouped


def _worst(row: dict[str, Any]) -> str:
    """The worst figures, slices included: `cosine 0.8432, SNR 1.5 dB (output 'y' slice 4:10 (scores))`."""
    if refused := row.get("compile_refused"):
        return f"did not compile ({refused['error']})"
    if note := row.get("note"):
        return note
    w = row["worst"]
    return f"cosine {w['cosine']:.6f}, SNR {w['snr_db']:.1f} dB ({w['where']})"


def table(search: dict[str, Any]) -> str:
    """The candidate table as text (the log and the console on failure)."""
    lines = [f"{'candidate':<20} {'cosine':>9} {'SNR dB':>8} {'bin bytes':>11}  result"]
    for r in search["candidates"]:
        if refused := r.get("compile_refused"):
            lines.append(f"{r['name']:<20} {'':>9} {'':>8} {'':>11}  did not compile: {refused['error']}")
            continue
        if note := r.get("note"):
            lines.append(f"{r['name']:<20} {'':>9} {'':>8} {'':>11}  {note}")
            continue
        w = r["worst"]
        verdict = "WINNER" if r["name"] == search["winner"] else (
            "pass" if r["passed"] else f"below threshold: {w['where']}"
            + (f" (stopped after {r['early_stop']['proof'].split(' sample')[0].removeprefix('after ')} of "
               f"{r['early_stop']['of']} samples)" if r.get("early_stop") else ""))
        lines.append(f"{r['name']:<20} {w['cosine']:>9.6f} {w['snr_db']:>8.1f} {r['bin_size']:>11}  {verdict}")
        if r.get("htp_only") and not r["passed"]:
            lines.append(f"{'':<20} {'':>9} {'':>8} {'':>11}  {r['htp_only']}")
    lines += [f"{s['name']:<20} {'':>9} {'':>8} {'':>11}  skipped: {s['reason']}" for s in search["skipped"]]
    return "\n".join(lines)
