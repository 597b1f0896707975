"""OUT/report.json and OUT/report.html: what the build did, per recipe x target, and the action graph.

Written after every build, no-op builds included, so it stays cheap: plain json and jinja2, no networkx,
no onnx. Everything comes from files the build already wrote: OUT/.ctxbuild/plan.json (the actions and their
deps), the records (status, cause, seconds, source, verify results), the compile specs (precision),
OUT/manifest.json (artifact sizes, toolchain) and OUT/.ctxbuild/last_build.json. A missing piece shows as "—".
The action graph's drawing is report_graph.py, the HTML report_html.py.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ctxbuild.plan import kinds, memory
from ctxbuild.atomic import read_json, write_if_changed
from ctxbuild.layout import STATE, layers_path, record_path, spec_name
from ctxbuild.outputs.search_table import search_of, with_costs
from ctxbuild.outputs.gate import WILL_NOT_LOAD
from ctxbuild.outputs.lineage import ancestors, topo_order
from ctxbuild.outputs.report_graph import layout
from ctxbuild.outputs.report_html import render_html

REPORT_VERSION = 1
NOT_NEEDED = "not needed"


def write_report(out: Path, *, build_id: str | None = None, returncode: int = 0, wall_seconds: float | None = None,
                 driver_peak_rss: int | None = None, selection: dict[str, list[str]] | None = None
                 ) -> dict[str, Any] | None:
    """Write OUT/report.json and OUT/report.html (atomically); returns the report data.

    build_id: the build that just ran (records carrying it are "this build"); without it, last_build.json says.
    wall_seconds: the build's wall time; without it, the span of this build's actions.
    selection: the recipes and targets the build was limited to (--only, --target; empty lists: all): the
    report holds only their rows and actions.
    Never fails the build: a problem is one warning line on stderr and None.
    """
    try:
        report = collect(Path(out), build_id=build_id, returncode=returncode, wall_seconds=wall_seconds,
                         selection=selection)
        report["memory"] = memory.section(_read_records(Path(out), report), driver_peak_rss)
        html = render_html(report, Path(out))
        # no indent: json's C encoder only runs without one (6x faster here); `jq .` pretty-prints it
        write_if_changed(Path(out) / "report.json", json.dumps(report, sort_keys=True).encode() + b"\n")
        write_if_changed(Path(out) / "report.html", html.encode())
        return report
    except Exception as e:  # noqa: BLE001 -- the build's result stands; the report is only a view of it
        where = f" to {Path(out)}" if isinstance(e, OSError) else ""  # what failed to write: OUT's files
        print(f"ctxbuild: warning: could not write the build report{where}: {type(e).__name__}: {e}", file=sys.stderr)
        return None


# ---- data -------------------------------------------------------------------------------------------------

def _read_records(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    return {n["id"]: read_json(record_path(out, n["id"])) for n in report["graph"]["nodes"]}


def collect(out: Path, *, build_id: str | None = None, returncode: int = 0,
            wall_seconds: float | None = None, selection: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The report as plain data (what report.json holds and the template renders)."""
    plan = read_json(out / STATE / "plan.json") or {"actions": []}
    manifest = read_json(out / "manifest.json") or {}
    last = read_json(out / STATE / "last_build.json") or {}
    actions = plan.get("actions", [])
    records = {a["id"]: read_json(record_path(out, a["id"])) for a in actions}
    if build_id is not None:
        this_build = {i for i, r in records.items() if r and r.get("build_id") == build_id}
    else:
        this_build = set(last.get("actions", {}))
    status = {a["id"]: _action_status(records[a["id"]], a["id"] in this_build) for a in actions}
    rows = [r for r in _rows(out, plan, manifest, records, status, this_build)
            if _selected({"recipes": [r["recipe"]], "target": r["target"]}, selection)]
    # Shown and counted: what the build was limited to (--only, --target), and whatever else it ran (a precision
    # search measures sibling SoCs); not a candidate's placeholders (an earlier candidate made it unneeded).
    shown = [a for a in actions if status[a["id"]] != NOT_NEEDED and (_selected(a, selection) or a["id"] in this_build)]
    failures = _failures(shown, records, status, this_build, rows)
    counts = _counts({a["id"]: status[a["id"]] for a in shown}, this_build, len(shown))
    if wall_seconds is None:  # not given by the driver: the span of this build's actions
        spans = [(r["started"], r["finished"]) for i, r in records.items()
                 if r and i in this_build and "started" in r and "finished" in r]
        wall_seconds = max(f for _, f in spans) - min(s for s, _ in spans) if spans else None
    # The outcome is this build's; a failure left from an earlier build still shows in its row and in failures.
    gate = [{"path": a["path"], "runtime": v["runtime"]["label"], "soc": v["soc"], "verdict": v["verdict"],
             "reason": v["reason"], "fix": v.get("fix")}
            for a in manifest.get("artifacts", []) for v in a.get("runtimes", [])]
    blocked = any(g["verdict"] == WILL_NOT_LOAD for g in gate)  # the build failed on it (engine/build.py)
    outcome = ("failed" if returncode != 0 or counts["failed"] or blocked
               else ("up to date" if not this_build else "ok"))
    note = None
    if returncode != 0 and not failures:
        note = (f"ninja stopped after {len(this_build)} action(s), none failed: see the console output" if this_build
                else "ninja failed before running an action: see the console output")
    return {
        "version": REPORT_VERSION,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "out": str(out),
        "build": {"id": build_id, "returncode": returncode, "outcome": outcome, "note": note,
                  "selection": selection or {"recipes": [], "targets": []},
                  "wall_seconds": None if wall_seconds is None else round(wall_seconds, 3), **counts},
        "toolchain": manifest.get("toolchain") or {},
        "rows": rows,
        "gate": gate,
        "failures": failures,
        "graph": layout(shown, status, {i: _href((r or {}).get("log")) for i, r in records.items()}),
    }


def _selected(a: dict[str, Any], selection: dict[str, list[str]] | None) -> bool:
    """An action of the recipes and targets the build was limited to (one for no target, a prepare or quantize,
    belongs to every target)."""
    recipes, targets = (selection or {}).get("recipes"), (selection or {}).get("targets")
    return ((not recipes or any(r in recipes for r in a["recipes"]))
            and (not targets or not a.get("target") or a["target"]["name"] in targets))


def _rows(out: Path, plan: dict[str, Any], manifest: dict[str, Any], records: dict[str, Any],
          status: dict[str, str], this_build: set[str]) -> list[dict[str, Any]]:
    """One row per deliverable x recipe, with its verifications, sizes and (bundles) sharing savings."""
    actions = plan.get("actions", [])
    by_id = {a["id"]: a for a in actions}
    failed_up = _failed_ancestors(actions, status)
    verifies: dict[tuple[str, str], list[dict[str, Any]]] = {}
    # A precision search's candidate verifies are measurements; its select is the verification that counts.
    candidates = {d for a in actions if kinds.get(a["kind"]).picks_candidate for d in a["deps"]}
    for a in actions:
        if kinds.get(a["kind"]).verification and a.get("target") and a["id"] not in candidates:
            for r in a["recipes"]:
                verifies.setdefault((r, a["target"]["name"]), []).append(a)
    sizes, sharing = _artifact_sizes(manifest)
    files: dict[tuple[str, str], list[dict[str, Any]]] = {}  # the row's artifacts, linked from the report
    for art in manifest.get("artifacts", []):
        if art.get("target") and art.get("path"):
            files.setdefault((art["recipe"], art["target"]["name"]), []).append(
                {"path": art["path"], "size": art.get("size"),
                 "kind": "bin" if str(art["path"]).endswith(".bin") else "ctx"})
    deliverables = {art["action"] for art in plan.get("artifacts", [])}
    if not deliverables:  # an older plan.json: every action of a deliverable kind is one
        deliverables = {a["id"] for a in actions if a["kind"] in kinds.names(deliverable=True)}
    rows = []
    for a in actions:
        if a["id"] not in deliverables or not a.get("target"):
            continue
        spec = read_json(out / STATE / "actions" / spec_name(a["id"])) or {}
        for recipe in a["recipes"]:
            pair = (recipe, a["target"]["name"])
            rows.append(_row(a, recipe, spec, records, status, by_id, failed_up, verifies.get(pair, []), sizes,
                             a["id"] in this_build, sharing.get(pair)))
            rows[-1]["files"] = sorted(files.get(pair, []), key=lambda f: (f["kind"] != "ctx", f["path"]))
    rows.sort(key=lambda r: (_natural(r["recipe"]), r["target"]["name"]))
    notes = {art["action"]: art["verify_note"] for art in plan.get("artifacts", []) if art.get("verify_note")}
    for row in rows:  # verification left off by default (a large model): said, not silently skipped
        if row["action"] in notes and not row["verify"]:
            row["warnings"].append(notes[row["action"]])
    return rows


def _artifact_sizes(manifest: dict[str, Any]) -> tuple[dict[tuple[str, str, str], list[int]],
                                                       dict[tuple[str, str], dict[str, Any]]]:
    """(recipe, target, "ctx"|"bin") -> sizes of its files; (recipe, target) -> a bundle's measured savings."""
    sizes: dict[tuple[str, str, str], list[int]] = {}
    sharing: dict[tuple[str, str], dict[str, Any]] = {}
    for art in manifest.get("artifacts", []):
        if art.get("weight_sharing") and art.get("target"):
            sharing[(art["recipe"], art["target"]["name"])] = {**art["weight_sharing"],
                                                              "graphs": sorted(art.get("graphs") or {})}
        kind = "bin" if art.get("kind") == "context_binary" or str(art.get("path", "")).endswith(".bin") else "ctx"
        k = (art["recipe"], art["target"]["name"] if art.get("target") else "", kind)
        sizes.setdefault(k, []).append(int(art.get("size") or 0))
    return sizes, sharing


def _failures(actions: list[dict[str, Any]], records: dict[str, Any], status: dict[str, str],
              this_build: set[str], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    failures = []
    for a in actions:
        rec = records[a["id"]]
        if status[a["id"]] == "failed" and rec:
            failures.append({"id": a["id"], "kind": a["kind"], "description": a.get("description") or a["id"],
                             "cause": _own_cause(a["id"], rec), "log": rec.get("log"),
                             "href": _href(rec.get("log")), "this_build": a["id"] in this_build,
                             "blocks": [f"{r['recipe']}@{r['target']['name']}" for r in rows
                                        if r["failed_action"] == a["id"]]})
    return failures


def _counts(status: dict[str, str], this_build: set[str], n_actions: int) -> dict[str, int]:
    return {"built": sum(s == "built" for s in status.values()),
            "from_cache": sum(s == "cache" for s in status.values()),
            "failed": sum(s == "failed" and i in this_build for i, s in status.items()),
            "up_to_date": sum(s in ("up to date", "up to date (cache)") for s in status.values()),
            "not_built": sum(s == "not built" for s in status.values()),
            "actions": n_actions}


def _row(a: dict[str, Any], recipe: str, spec: dict[str, Any], records: dict[str, Any],
         status: dict[str, str], by_id: dict[str, Any], failed_up: dict[str, str],
         verify_actions: list[dict[str, Any]], sizes: dict[tuple[str, str, str], list[int]],
         this_build: bool, sharing: dict[str, Any] | None) -> dict[str, Any]:
    rec = records[a["id"]] or {}
    st = status[a["id"]]
    tname = a["target"]["name"]
    params = spec.get("params") or {}
    verify = [_verify(v, records[v["id"]], status[v["id"]]) | {"blocked_by": failed_up.get(v["id"])}
              for v in verify_actions]
    ctx, bins = sizes.get((recipe, tname, "ctx"), []), sizes.get((recipe, tname, "bin"), [])
    # Compiles that exist only for verification (a bundle member or a multi-SoC binary built alone) count
    # as verify time; they are the verify actions' compile/bundle deps other than this deliverable.
    twins = sorted({d for v in verify_actions for d in v["deps"]
                    if d != a["id"] and d in by_id and by_id[d]["kind"] in kinds.names(deliverable=True)})
    vsecs = [v["seconds"] for v in verify] + [(records[t] or {}).get("seconds") for t in twins]
    row: dict[str, Any] = {
        "recipe": recipe, "target": a["target"], "action": a["id"], "kind": a["kind"],
        "status": {"built": "ok", "up to date": "ok", "cache": "from cache",
                   "up to date (cache)": "from cache"}.get(st, st),
        "this_build": this_build,
        "precision": _precision(params),
        "ctx_size": sum(ctx) if ctx else None, "ctx_files": len(ctx),
        "bin_size": sum(bins) if bins else None, "bin_files": len(bins),
        "sharing": None, "search": None, "compile_seconds": rec.get("seconds"),
        "verify_seconds": round(sum(x or 0 for x in vsecs), 3) if any(x is not None for x in vsecs) else None,
        "verify_compiles": twins,
        "cache": {"cache": "hit", "run": "miss"}.get(rec.get("source") or ""),
        "cache_origin": rec.get("cache_origin"),
        "verify": verify,
        "accuracy": (None if not any(v["passed"] is not None for v in verify)
                     else all(v["passed"] for v in verify if v["passed"] is not None)),
        "coverage": _coverage([v for v in verify if not v["adapter"]]),  # adapters run the same graph
        "cause": None, "log": None, "href": None, "failed_action": None,
        "warnings": list(rec.get("warnings") or []),
        "rewrites": {},  # prepare's legalization (graph/legalize): rule -> count
    }
    if search := search_of(rec):
        row["search"] = with_costs(search, a.get("candidates", {}), records.get)
        cands = row["search"]["candidates"]
        row["precision"] = f"auto: {row['search']['winner'] or 'none passed'}"
        for step, col in (("compile", "compile_seconds"), ("verify", "verify_seconds")):
            row[col] = round(sum(c["seconds"].get(step) or 0 for c in cands), 3)
        row["verify_compiles"] = []
    if sharing:
        sep, saved = sharing.get("separate_bin_size"), sharing.get("saved_bytes")
        row["sharing"] = {"graphs": sharing["graphs"], "bin_size": sharing.get("bundle_bin_size"), "separate_bin_size": sep,
                          "saved_bytes": saved,
                          "saved_fraction": round(saved / sep, 4) if saved is not None and sep else None}
    for dep in ancestors(a["id"], by_id):  # e.g. "calibrating on random data" from quantize
        row["warnings"] += [w for w in (records[dep] or {}).get("warnings") or [] if w not in row["warnings"]]
        row["rewrites"].update((records[dep] or {}).get("rewrites") or {})
    culprit = None
    if st == "failed":
        culprit = a["id"]
    elif st == "not built" and a["id"] in failed_up:
        culprit = failed_up[a["id"]]
    else:  # the deliverable is fine; its verification failed, or could not run because something it needs failed
        culprit = next((v["id"] for v in verify if v["status"] == "failed"), None) or next(
            (failed_up[v["id"]] for v in verify if v["status"] == "not built" and v["id"] in failed_up), None)
    if culprit:
        crec = records[culprit] or {}
        row.update(status="failed", failed_action=culprit, log=crec.get("log"), href=_href(crec.get("log")))
        cause = _own_cause(culprit, crec) or "no cause recorded"
        row["cause"] = cause if culprit == a["id"] else f"{by_id[culprit].get('description') or culprit}: {cause}"
    return row


def _verify(a: dict[str, Any], rec: dict[str, Any] | None, st: str) -> dict[str, Any]:
    rec = rec or {}
    res: dict[str, Any] = rec["result"] if isinstance(rec.get("result"), dict) else {}
    thr = res.get("thresholds") or {}
    min_cos, min_snr = thr.get("min_cosine"), thr.get("min_snr_db")
    outputs = []
    for name, m in sorted((res.get("outputs") or {}).items()):
        cos, snr = m.get("cosine"), m.get("snr_db")
        floor = m.get("min_cosine", min_cos)  # an LLM part's KV output has a floor of its own (min_kv_cosine)
        outputs.append({"name": name, "cosine": cos, "snr_db": snr, "max_abs": m.get("max_abs"),
                        "mean_abs": m.get("mean_abs"), "argmax_agreement": m.get("argmax_agreement"), "min_cosine": floor,
                        "cosine_ok": None if cos is None or floor is None else cos >= floor,
                        "snr_ok": None if snr is None or min_snr is None else snr >= min_snr,
                        "slices": [{"slice": x.get("slice"), "range": f"{x.get('start')}:{x.get('stop')}",
                                    "cosine": x.get("cosine"), "snr_db": x.get("snr_db"),
                                    "ok": None if min_cos is None or min_snr is None
                                    else x.get("cosine", 0) >= min_cos and x.get("snr_db", 0) >= min_snr}
                                   for x in m.get("slices") or []]})
    passed = res.get("passed")
    if st == "failed" and passed is None:
        passed = False
    graph = res.get("graph") or a["id"].split("/", 1)[-1].split("@")[0]
    adapter = res.get("adapter") or (a["id"].rsplit("@", 1)[0].rsplit("+", 1)[-1] if kinds.get(a["kind"]).binds_adapter else None)
    return {"id": a["id"], "status": st, "graph": f"{graph} + adapter {adapter}" if adapter else graph, "adapter": adapter,
            "passed": passed, "method": res.get("method"), "samples": res.get("samples"),
            "context_lengths": sorted(int(c) for c in res["by_cl"]) if res.get("by_cl") else None,  # llm_part_eval, llm_eval
            "sample_source": res.get("sample_source"), "thresholds": thr, "outputs": outputs,
            "coverage": res.get("coverage"), "simulator_seconds": rec.get("simulator_seconds"),
            "quality": res.get("quality"),  # llm_quality: perplexity, agreement, the texts side by side
            "clipping": [c["tensor"] for c in res.get("clipping") or []],  # LoRA: tensors leaving their encodings
            "seconds": rec.get("seconds"), "cause": _one_line(rec.get("cause")), "log": rec.get("log"),
            "href": _href(rec.get("log")), "layers": _layers(a, rec)}


def _layers(a: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any] | None:
    """`ctxbuild verify --layers` wrote `<graph>_layers.json` beside the verify result (a precision search's: the
    select's `<recipe>_verify.json`): its gist, unless the verification ran again since (then it describes another
    build)."""

    outs = a.get("outputs") or []
    if not outs:
        return None
    path = layers_path(next((o for o in outs if o.endswith("_verify.json")), outs[0]))
    try:
        if path.stat().st_mtime < rec.get("finished", 0):
            return None
    except OSError:
        return None
    d = read_json(path)
    if not isinstance(d, dict):
        return None
    worst = d.get("worst_quantization" if d.get("where") == "quantization" else "worst_htp") or []
    return {"where": d.get("where"), "hint": d.get("hint"),
            "worst": [{k: n.get(k) for k in ("node", "op_type", "quant_snr_db", "htp_snr_db")} for n in worst[:5]]}


def _coverage(verify: list[dict[str, Any]]) -> dict[str, Any] | None:
    covs = [v["coverage"] for v in verify if isinstance(v.get("coverage"), dict)]
    if not covs:
        return None
    qnn = sum(int(c.get("qnn_nodes") or 0) for c in covs)
    cpu = sum(int(c.get("cpu_nodes") or 0) for c in covs)
    frac = qnn / (qnn + cpu) if qnn + cpu else covs[0].get("fraction")
    found = {"qnn_nodes": qnn, "cpu_nodes": cpu, "fraction": None if frac is None else round(frac, 4)}
    shares = [c["cpu_macs_share"] for c in covs if c.get("cpu_macs_share") is not None]
    if cpu:  # cpu_fallback (qnn/fallback.py): the cuts, the worst graph's share of its MACs on the CPU, the CPU's ops
        ops: dict[str, int] = {}
        for c in covs:
            for op, n in (c.get("cpu_ops") or {}).items():
                ops[op] = ops.get(op, 0) + n
        found |= {"partitions": max(int(c.get("partitions") or 0) for c in covs),
                  "cpu_macs_share": max(shares) if shares else None, "cpu_ops": ops,
                  "macs_unknown": [u for c in covs for u in c.get("macs_unknown") or []]}
    return found


def _precision(params: dict[str, Any]) -> str | None:
    if params.get("precision"):
        return str(params["precision"])
    graphs = params.get("graphs")
    if isinstance(graphs, list):
        ps = sorted({str(g["precision"]) for g in graphs if isinstance(g, dict) and g.get("precision")})
        return "/".join(ps) or None
    return None


def _action_status(rec: dict[str, Any] | None, this_build: bool) -> str:
    """built | cache | failed (this build), up to date | up to date (cache) (earlier build), not built, not needed
    (a precision-search candidate's placeholders)."""
    if rec is None:
        return "not built"
    if rec.get("status") == "failed":
        return "failed"
    if rec.get("status") != "ok":
        return "not built"
    if rec.get("not_needed"):
        return NOT_NEEDED
    cached = rec.get("source") == "cache"
    if this_build:
        return "cache" if cached else "built"
    return "up to date (cache)" if cached else "up to date"


def _failed_ancestors(actions: list[dict[str, Any]], status: dict[str, str]) -> dict[str, str]:
    """Action id -> the id of a failed action upstream of it (actions are in topological order in plan.json)."""
    culprit: dict[str, str] = {}
    for a in topo_order(actions):
        for d in a["deps"]:
            if d in status and status[d] == "failed":
                culprit[a["id"]] = d
                break
            if d in culprit:
                culprit[a["id"]] = culprit[d]
                break
    return culprit


def _natural(s: str) -> list[Any]:
    """"v2" before "v10"."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", s) if t]


def _one_line(s: Any) -> str | None:
    if not s:
        return None
    lines = [ln.strip() for ln in str(s).strip().splitlines() if ln.strip()]
    return lines[0] if lines else None


def _own_cause(aid: str, rec: dict[str, Any]) -> str | None:
    """The record's cause line, without a leading "<name>@<target>: " that only repeats the action's id."""
    cause = _one_line(rec.get("cause"))
    head, sep, rest = (cause or "").partition(": ")
    if sep and "@" in head and " " not in head and aid.endswith(head) and rest:
        return rest
    return cause


def _href(log: str | None) -> str | None:
    return quote(log, safe="/@+-_.~") if log else None

