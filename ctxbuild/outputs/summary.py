"""The end of a build, from report.json: actions built/restored/failed, accuracy per graph per target, where
the report is; as text lines or as the one JSON document of `ctxbuild build --json`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.outputs.search_table import search_of
from ctxbuild.plan import kinds


def document(out: Path, returncode: int, *, noop: bool = False, searched: list[dict[str, Any]] | None = None
             ) -> dict[str, Any]:
    """The build's results. `noop`: nothing ran (the accuracy is the last build's, still current). `searched`: the
    select records whose answers the build reports (the console's pin lines), as `pins`."""
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        report = {}
    b = report.get("build") or {}
    actions = ({"built": 0, "restored": 0, "failed": 0} if noop else
               {"built": b.get("built", 0), "restored": b.get("from_cache", 0), "failed": b.get("failed", 0)})
    try:
        artifacts = json.loads((out / "manifest.json").read_text()).get("artifacts", [])
    except (OSError, ValueError):
        artifacts = []
    return {"ok": returncode == 0, "exit_code": returncode, "error": None, "out": str(out), "up_to_date": noop,
            "actions": actions, "wall_seconds": None if noop else b.get("wall_seconds"),
            "accuracy": accuracy(report.get("rows") or []),
            "failures": [{k: f.get(k) for k in ("id", "cause", "log")} for f in report.get("failures") or []
                         if f.get("this_build") and not noop],
            "pins": answers(searched or []),
            "artifacts": [{k: a.get(k) for k in ("recipe", "graph", "kind", "path", "size", "sha256")}
                          | {"target": (a.get("target") or {}).get("name")} for a in artifacts],
            "report": str(out / "report.html"), "manifest": str(out / "manifest.json")}


def accuracy(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per verification (a graph on a target, with an adapter, or an LLM's token check): the worst
    output's cosine and SNR. A verification several deliverables share (an LLM's parts and its genai config)
    is listed once."""
    result, seen = [], set()
    for row in rows:
        for v in row.get("verify") or []:
            if v.get("id") in seen:
                continue
            seen.add(v.get("id"))
            # an output's slices are measured too (a concatenated output): its worst part is the graph's worst
            outs = [{**o, "label": o.get("name")} for o in v.get("outputs") or []]
            outs += [{**x, "label": f"{o['label']} slice {x.get('range')}"} for o in outs for x in o.get("slices") or []
                     if x.get("cosine") is not None and x.get("snr_db") is not None]
            result.append({"recipe": row.get("recipe"), "graph": v.get("graph"), "adapter": v.get("adapter"),
                           "context_lengths": v.get("context_lengths"), "sample_source": v.get("sample_source"),
                           "target": (row.get("target") or {}).get("name"), "status": v.get("status"),
                           "passed": v.get("passed"), "blocked_by": v.get("blocked_by"),
                           "cosine": min((o["cosine"] for o in outs), default=None),
                           "snr_db": min((o["snr_db"] for o in outs), default=None),
                           "worst": min(outs, key=lambda o: o["snr_db"])["label"] if outs else None,
                           # the floor gating the lowest cosine shown, where it is an output's own (an LLM part's KV)
                           "worst_floor": min(outs, key=lambda o: o["cosine"]).get("min_cosine") if outs else None,
                           "quality": quality_line(v.get("quality"), v.get("thresholds")),  # llm_quality's figures
                           "precision": row.get("precision"),  # a search's: "auto: <the candidate it ships>"
                           "thresholds": v.get("thresholds"), "on_cpu": on_cpu(v.get("coverage"))})
    return result


def text(doc: dict[str, Any]) -> list[str]:
    a = doc["actions"]
    if doc["up_to_date"]:
        head = "ctxbuild: up to date"
    else:
        secs = f" in {doc['wall_seconds']:.1f} s" if doc.get("wall_seconds") is not None else ""
        head = f"ctxbuild: {a['built']} built, {a['restored']} restored, {a['failed']} failed{secs}"
    lines = [head]
    acc = doc["accuracy"]
    if acc:
        table = [(r["recipe"] or "-", _checked(r), r["target"] or "-", r) for r in acc]
        rw, cw, tw = (max(len(h), *(len(x[i]) for x in table)) for i, h in enumerate(("recipe", "checked", "target")))
        lines.append(f"  {'recipe':<{rw}}  {'checked':<{cw}}  {'target':<{tw}} {'cosine':>8} {'SNR dB':>7}  verdict")
        for recipe, checked, target, r in table:
            cos = "-" if r["cosine"] is None else f"{r['cosine']:.4f}"
            snr = "-" if r["snr_db"] is None else f"{r['snr_db']:.1f}"
            lines.append(f"  {recipe:<{rw}}  {checked:<{cw}}  {target:<{tw}} {cos:>8} {snr:>7}  {_verdict(r)}")
    elif doc["artifacts"]:
        lines.append("  (no graph verified: --no-verify or `verify: false`)")
    lines.append(f"ctxbuild: report: {doc['report']}")
    return lines


def _checked(r: dict[str, Any]) -> str:
    """What a verification checked: the graph (and adapter); an LLM's token and part checks name their context lengths."""
    label = r["graph"] or "-"
    if cls := r.get("context_lengths"):  # a part's check (llm_part_eval) names no tokens: its CLs follow
        at = f"CL {','.join(map(str, cls))}"
        label = label.replace("tokens", f"tokens {at}", 1) if "tokens" in label else f"{label} {at}"
    return label


def rewrites(records: list[dict[str, Any]]) -> list[str]:
    """Per model prepare ran in this build, by its recipes: one line with the rewrites legalization made, one
    with the rules its sample check withdrew and why (each when there are any)."""
    lines = []
    for r in sorted(records, key=lambda r: r["id"]):
        if not _kind(r).legalizes or r.get("status") != "ok":
            continue
        who = ", ".join(r.get("recipes") or [r["id"]])
        if r.get("rewrites"):
            made = ", ".join(f"{n} {rule}" for rule, n in r["rewrites"].items())
            lines.append(f"ctxbuild: {who}: rewritten for the HTP: {made} (docs/legalization.md)")
        if r.get("withdrawn"):
            why = "; ".join(f"{rule}: {reason}" for rule, reason in r["withdrawn"].items())
            lines.append(f"ctxbuild: {who}: rewrite withdrawn by the sample check: {why} "
                         "(docs/legalization.md)")
    return lines


def answers(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per precision search in `records` decided with a mixed-precision answer: {recipe, targets, nodes, pin}, once
    for the targets that share it (`pin`: the recipe lines, settings the recipe does not hold, decided from the
    diagnosis; `nodes`: those it keeps at higher precision)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r["id"]):
        search = r.get("search") or {}
        winner = next((c for c in search.get("candidates", []) if c["name"] == search.get("winner")), None)
        if not _kind(r).picks_candidate or not winner or winner.get("precision") != "mixed" or not search.get("pin"):
            continue
        recipe, _, target = r["id"].removeprefix("select/").rpartition("@")
        found.setdefault((recipe, search["pin"]), {"recipe": recipe, "targets": [], "nodes": winner.get("blamed") or [],
                                                   "pin": search["pin"]})["targets"].append(target)
    return list(found.values())


def pins(records: list[dict[str, Any]]) -> list[str]:
    """The answers as lines to paste; a recipe whose targets' answers differ says that one recipe pins one answer
    for all of them."""
    lines = []
    found = answers(records)
    for a in found:
        nodes = a["nodes"]  # a set grown in rounds holds tens of nodes: the lines below name them all
        named = ", ".join(nodes) if len(nodes) <= 4 else f"{len(nodes)} nodes ({', '.join(nodes[:3])}, ...)"
        lines.append(f"ctxbuild: {a['recipe']}@{', '.join(a['targets'])}: the search's answer keeps {named} at higher "
                     "precision; to pin it, put in the recipe:")
        lines += ["    " + ln for ln in a["pin"].splitlines()]
    for recipe in dict.fromkeys(a["recipe"] for a in found):
        split = [a["targets"] for a in found if a["recipe"] == recipe]
        if len(split) > 1:
            lines.append(f"ctxbuild: {recipe}: the targets' answers differ and a recipe's quantization applies to "
                         "every target: pin each in a recipe of its own ("
                         + " and ".join(f"targets: [{', '.join(t)}]" for t in split) + ")")
    return lines


def sibling_skips(records: list[dict[str, Any]]) -> list[str]:
    """Per precision search this build decided that skipped candidates on an earlier target's measurement: which,
    and whose (the rows of `<recipe>_search.json` say why)."""
    lines = []
    for r in sorted(records, key=lambda r: r["id"]):
        by: dict[str, list[str]] = {}
        for c in (search_of(r) or {}).get("candidates", []) if _kind(r).picks_candidate else []:
            if c.get("predicted_by"):
                by.setdefault(c["predicted_by"], []).append(c["name"])
        if by:
            lines.append(f"ctxbuild: {r['id'].removeprefix('select/')}: not compiled, failed on a sibling SoC's "
                         "simulator: " + "; ".join(f"{', '.join(n)} ({soc}'s measurement)" for soc, n in by.items()))
    return lines


def quality_line(q: dict[str, Any] | None, gates: dict[str, float] | None = None) -> str | None:
    """An LLM's quality figures in a few words: perplexity ratio and greedy agreement per backend measured, a figure
    past its gate with the digits that show it so."""
    if not q:
        return None
    from ctxbuild.figures import over, under

    gates = gates or {}
    ceiling, floor = gates.get("max_ppl_ratio", float("inf")), gates.get("min_agreement", float("-inf"))
    names = {"qdq_cpu": "CPU", "simulator": "simulator"}
    parts = []
    for b, m in q.items():
        if b in names and isinstance(m, dict):
            said = [f"ppl {over(m['ppl_ratio'], ceiling, 3)}x"] if m.get("ppl_ratio") is not None else []
            said += [f"agreement {under(m['agreement'], floor, 2)}"] if m.get("agreement") is not None else []
            parts += [f"{names[b]} {', '.join(said)}"] if said else []
    return "; ".join(parts) or None


def on_cpu(coverage: dict[str, Any] | None) -> dict[str, Any] | None:
    """What compile.cpu_fallback left on the CPU (verify's coverage): the CPU's share of the model's counted MACs,
    its ops, the nodes whose MACs are unknown; None when the whole graph ran on the NPU (or was not verified)."""
    if not coverage or not coverage.get("cpu_nodes"):
        return None
    return {"macs_share": coverage.get("cpu_macs_share"), "nodes": coverage["cpu_nodes"],
            "ops": coverage.get("cpu_ops") or {}, "macs_unknown": coverage.get("macs_unknown") or []}


def cpu_note(cpu: dict[str, Any] | None) -> str:
    """'on the CPU: 97.1% of the MACs (3 LSTM, 2 other nodes)': a CPU-fallback build's verdict says where the
    compute ran; MACs that could not be counted are said, not left out."""
    if cpu is None:
        return ""
    from ctxbuild.graph.macs import WITH_MACS

    heavy = {op: n for op, n in sorted(cpu["ops"].items()) if op in WITH_MACS}
    others = cpu["nodes"] - sum(heavy.values())
    ops = ", ".join([f"{n} {op}" for op, n in heavy.items()]
                    + ([f"{others} {'other ' * bool(heavy)}node{'s' * (others != 1)}"] if others > 0 else []))
    unknown = cpu["macs_unknown"]
    counted = "counted " if unknown else ""
    share = (f"{100 * cpu['macs_share']:.1f}% of the {counted}MACs" if cpu["macs_share"] is not None
             else "share of MACs unknown" if unknown else "no MACs counted in the model")
    named = ", ".join(f"{u['node']} ({u['op']}, {u['on']})" for u in unknown[:3]) + (
        f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
    return f"; on the CPU: {share} ({ops})" + (f"; MACs unknown: {named}" if unknown else "")


def _verdict(r: dict[str, Any]) -> str:
    return _outcome(r) + (cpu_note(r.get("on_cpu")) if r.get("cosine") is not None else "")


def _outcome(r: dict[str, Any]) -> str:
    if r.get("quality"):  # an LLM's quality gates: their figures, not a cosine
        t = r.get("thresholds") or {}
        gates = f"max {t.get('max_ppl_ratio')}x, min {t.get('min_agreement')}"
        return f"{'ok' if r['passed'] else 'FAILED'} ({r['quality']}; {gates})" if r.get("passed") is not None \
            else _outcome({**r, "quality": None})
    if r["passed"] and r.get("sample_source") == "random":
        return "unverified: random inputs (give verify.dir or calibration.dir)"
    if r["passed"]:  # a precision search says what it chose: the user did not
        if (r.get("precision") or "").startswith("auto: "):
            return f"ok ({r['precision']})"
        floor, t = r.get("worst_floor"), r.get("thresholds") or {}
        # the row's cosine is the lowest shown; gated at its own floor (KV), the row says which
        below = r.get("cosine") is not None and t.get("min_cosine") is not None and r["cosine"] < t["min_cosine"]
        return f"ok (KV min cosine {floor})" if below and floor is not None and floor != t.get("min_cosine") else "ok"
    t = r.get("thresholds") or {}
    if r.get("status") == "not built":  # a failure upstream, or the build stopped first (-k, Ctrl-C)
        return f"not run: {r['blocked_by']} failed" if r.get("blocked_by") else "not run (the build stopped first)"
    if r["cosine"] is None:
        return "FAILED (see above)"
    at = f" at {r['worst']}" if " slice " in (r.get("worst") or "") else ""  # a part: the whole may look fine
    gates = [f"min cosine {t.get('min_cosine')}"]
    gates += [f"min SNR {t['min_snr_db']} dB"] if t.get("min_snr_db") is not None else []
    gates += [f"KV min cosine {t['min_kv_cosine']}"] if t.get("min_kv_cosine") is not None else []  # an LLM part
    return f"FAILED{at} ({', '.join(gates)})"


def _kind(record: dict[str, Any]) -> type[kinds.Kind]:
    return kinds.get(record["kind"])
