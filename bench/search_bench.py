"""Benchmark: a cold `precision: auto` search over real public models x 2 SoCs, the code as it was (a git
worktree of a base commit, default: main) against this tree, side by side in one run.

Per implementation: a fresh cache and OUT, `ctxbuild build -j2` of one `precision: auto` recipe per model
(default ladder w8a16 -> w8a16-pc -> w16a16 -> mixed -> fp16, default thresholds), the two builds at the same
time; wall time, the seconds of every action kind (from the action records), how many actions ran, how many
verify actions ran the simulator and the simulator seconds they recorded (per action: on a loaded machine compare
these, not the wall), and each target's candidate states. Where the base found a winner, this tree's must be the
same (asserted); where it found none, this tree's is listed. For the CPU screen's margin it also
measures, on the base run's candidates, the QDQ model on the CPU EP against the float model, next to the
simulator's figures for the same candidate.

Usage: python bench/search_bench.py [--models ppocr_cls,...] [--base main] [--workdir DIR]
(default: every model of bench/real_models/models.py). With --workdir the runs stay in DIR and a base run
already there (DIR/old.json) is reused: the base's cold build is the long half.
Writes bench/results/search_bench.json. Needs the real-model packages (bench/real_models/models.py).

Counting mode, no simulator: `--replay OUT[,EARLIER...] [--save FILE]` walks this tree's search over a base run's
measurements and prints verify actions, simulator seconds and winners against the base's; `--figures FILE`
does the same over measurements a `--save` kept (the OUTs of a long base run rarely outlive the session).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench.real_models.inputs import write_samples  # noqa: E402
from bench.real_models.models import MODELS, SEARCH_SET, MissingModel, locate  # noqa: E402

BENCHMARK = "cold precision search, base commit's search vs this tree's, real models x 2 SoCs"

TARGETS = ["SM8650", "SM8750"]
CALIBRATION, VERIFY = 8, 4


def write_tree(root: Path, names: list[str]) -> Path:
    rec = root / "recipes"
    rec.mkdir(parents=True)
    for name in names:
        m = MODELS[name]
        shape = list(m.shape)
        write_samples(name, rec / "data" / name / "cal", CALIBRATION)
        write_samples(name, rec / "data" / name / "verify", VERIFY, first_seed=1000)
        (rec / f"{name}.yaml").write_text(
            f"model: {locate(name)}\ninputs: {{{m.input}: {shape}}}\nprecision: auto\n"
            f"calibration: {{dir: data/{name}/cal}}\ntargets: [{', '.join(TARGETS)}]\n"
            # a timeout long enough for the YOLO detector's 640x640 samples on a loaded machine: a verify that
            # times out fails its candidate and changes the winner
            f"verify: {{dir: data/{name}/verify, samples: {VERIFY}, timeout_s: 7200}}\n")
    return rec


def build(src: Path, recipes: Path, out: Path, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache), "PYTHONPATH": str(src)}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(recipes), "-o", str(out), "-j2", "-k", "0"],
                       capture_output=True, text=True, env=env, cwd=src)
    return {"returncode": p.returncode, "wall_s": round(time.perf_counter() - t, 1),
            "tail": p.stdout.strip().splitlines()[-3:] + p.stderr.strip().splitlines()[-3:]}


def counts(out: Path) -> dict[str, Any]:
    """What a build's action records say: seconds per kind, actions, simulator runs and seconds, the mixed rung's
    diagnosis seconds, winners, states."""
    recs = [json.loads(f.read_text()) for f in (out / ".ctxbuild" / "records").glob("*.json")]
    by_kind: dict[str, float] = {}
    for r in recs:
        by_kind[r["kind"]] = round(by_kind.get(r["kind"], 0.0) + (r.get("seconds") or 0.0), 2)
    winners, states = {}, {}
    for r in recs:
        if r["kind"] == "select":
            search = r.get("search") or (r.get("result") or {}).get("search") or {}
            # before the staged search (97436d3) a select named its winner `candidate` and its rows had `passed`
            winners[r["id"]] = search.get("winner") or (r.get("result") or {}).get("candidate")
            states[r["id"]] = {c["name"]: c.get("state") or {True: "passed", False: "failed"}.get(c.get("passed"))
                               for c in search.get("candidates", [])}
    simulated = [r for r in recs if r["kind"] == "verify" and r.get("simulator_seconds") is not None]
    return {"seconds_by_kind": by_kind, "actions_run": sum(r.get("source") == "run" for r in recs), "actions": len(recs),
            "simulator_runs": len(simulated), "simulator_s": round(sum(r["simulator_seconds"] for r in simulated), 1),
            "early_stopped": sum("early_stop" in (r.get("result") or {}) for r in simulated), "states": states,
            # the mixed rung's per-node diagnosis: debug builds on the simulator (or its CPU half), not a verify
            "diagnose_s": round(sum(r.get("diagnose_seconds") or 0.0 for r in recs if r["kind"] == "culprits"), 1),
            "compiles_real": sum(r["kind"] == "compile" and not r.get("skipped") and r.get("source") == "run" for r in recs),
            "winners": winners}


def cpu_vs_htp(out: Path) -> list[dict[str, Any]]:
    """Per verified candidate of a base run: worst-output SNR on the simulator and of its QDQ model on the CPU EP."""
    import numpy as np
    import onnxruntime as ort

    def run(model: str, feeds: list[dict[str, Any]]) -> dict[str, Any]:
        s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        names = [o.name for o in s.get_outputs()]
        got = [s.run(None, f) for f in feeds]
        return {n: np.concatenate([g[i] for g in got]).astype(np.float64).ravel() for i, n in enumerate(names)}

    rows = []
    specs = {json.loads(f.read_text())["id"]: json.loads(f.read_text()) for f in (out / ".ctxbuild" / "actions").glob("*.json")}
    recs = {json.loads(f.read_text())["id"]: json.loads(f.read_text()) for f in (out / ".ctxbuild" / "records").glob("*.json")}
    done: dict[str, dict[str, float]] = {}
    for vid, spec in specs.items():
        if spec["kind"] != "verify" or not (recs.get(vid) or {}).get("result", {}).get("outputs"):
            continue
        model, ref = spec["inputs"]["compiled"], spec["inputs"]["reference"]
        if model not in done:
            verify_dir = Path(spec["watch"][0])
            feeds = [dict(np.load(p)) for p in sorted(verify_dir.glob("*.npz"))[:VERIFY]]
            a, b = run(ref, feeds), run(model, feeds)
            done[model] = {n: float(10 * np.log10((a[n] @ a[n]) / max((a[n] - b[n]) @ (a[n] - b[n]), 1e-30))) for n in a}
        htp = {o: m["snr_db"] for o, m in recs[vid]["result"]["outputs"].items()}
        rows.append({"verify": vid, "htp_snr_db": min(htp.values()), "cpu_qdq_snr_db": round(min(done[model].values()), 3),
                     "htp_minus_cpu_db": round(min(htp.values()) - min(done[model].values()), 3)})
    return rows


def installed(model: str) -> Path:
    """A base run's model file, or the same file of this tree's installed packages when the base's environment
    is gone (the runs outlive the worktrees that made them)."""
    if Path(model).is_file():
        return Path(model)
    here = {locate(n).name: locate(n) for n in MODELS}
    if Path(model).name not in here:
        raise MissingModel(f"{model}: not found, and no model of bench/real_models/models.py has its name")
    return here[Path(model).name]


def recorded(out: Path, earlier: list[Path]) -> dict[str, Any]:
    """What a base run measured, as the replay reads it (`--save` writes it, `--figures` replays it without the
    OUT): per select (target), its ladder and thresholds, every candidate's CPU screen measured again with this
    tree's screen (per output and slice, on the same samples; None where the base never screened it) and every
    verify that ran the simulator (its result and the simulator seconds the base recorded, or those of the run
    with the same key in an `earlier` OUT when the base restored it from its cache); the base's own simulator
    runs and winners."""
    import numpy as np

    from ctxbuild.graph.modelio import load
    from ctxbuild.verify import slices
    from ctxbuild.verify.gates import is_skipped
    from ctxbuild.verify.measure import compare, cpu_outputs, metrics

    specs = [json.loads(f.read_text()) for f in (out / ".ctxbuild" / "actions").glob("*.json")]
    by_output = {o: s for s in specs for o in s["outputs"].values()}
    recs = {json.loads(f.read_text())["id"]: json.loads(f.read_text()) for f in (out / ".ctxbuild" / "records").glob("*.json")}
    simulated = {r["key"]: r["simulator_seconds"] for d in [out, *earlier] for f in (d / ".ctxbuild" / "records").glob("verify.*")
                 if (r := json.loads(f.read_text())).get("simulator_seconds") is not None}

    def simulator_s(rec: dict[str, Any]) -> float | None:
        """The seconds of a real simulator run behind a verify record, None if there was none."""
        return simulated.get(rec.get("key")) if (rec.get("result") or {}).get("outputs") else None

    def screen(spec: dict[str, Any]) -> dict[str, Any] | None:
        base = (recs.get(spec["id"]) or {}).get("result") or {}
        if is_skipped(base):  # the mixed rung's screen behind a closed gate: the diagnosis blamed no node
            return base
        if not (base.get("outputs") or base.get("error")):
            return None  # the base never screened it (or is still at it)
        feeds = [dict(np.load(p)) for p in sorted(Path(spec["watch"][0]).glob("*.npz"))[:VERIFY]]
        ref, got = cpu_outputs(installed(spec["inputs"]["original"]), feeds), cpu_outputs(Path(spec["inputs"]["model"]), feeds)
        res = {"outputs": compare(ref, got)}
        slices.annotate(res["outputs"], load(Path(spec["inputs"]["reference"]), external_data=False), None, ref, got, metrics)
        return res

    targets: dict[str, Any] = {}
    for sel in (s for s in specs if s["kind"] == "select"):
        cands = sel["params"]["candidates"]
        screens = {c["name"]: screen(by_output[sel["inputs"][f"{c['name']}.screen"]])
                   for c in cands if f"{c['name']}.screen" in sel["inputs"]}
        verifies = {}
        for c in cands:
            v = recs.get(by_output[sel["inputs"][f"{c['name']}.result"]]["id"]) or {}
            if (sim := simulator_s(v)) is not None or (v.get("result") or {}).get("compile_refused"):
                verifies[c["name"]] = {"result": v["result"], "simulator_s": sim or 0.0}
        targets[sel["id"]] = {"candidates": cands, "thresholds": sel["params"]["thresholds"], "screens": screens,
                              "verifies": verifies}
    base = [x for r in recs.values() if r["kind"] == "verify" and (x := simulator_s(r)) is not None]
    return {"targets": targets, "base": {"simulator_runs": len(base), "simulator_s": round(sum(base), 1),
                                         "winners": counts(out)["winners"]}}


def replay(figures: dict[str, Any], sibling_rule: bool = True) -> dict[str, Any]:
    """Counting mode: this tree's search walked over a base run's measurements (`recorded`), without a simulator.
    The walk asks for results in gate order; a verify it asks for counts with the simulator seconds the base
    recorded. Valid while this tree runs a subset of the base's candidates: a result the base never made is
    `missing`. Targets are walked in TARGETS order, each with the earlier ones' measurements as siblings
    (`sibling_rule`: the recipe default, auto.siblings). Returns per target and in all: the verify actions that
    ran the simulator and their seconds, against the base's, and whether the winners are the base's."""
    from ctxbuild.verify.ladder import walk
    from ctxbuild.verify.predict import rules

    targets = {}
    total = 0.0  # summed unrounded: each target's figure is rounded for display (several 0.05 s runs add up)
    measured: dict[str, dict[str, dict[str, Any]]] = {}  # recipe -> target -> its verifies: the later targets' siblings
    for sel_id in sorted(figures["targets"], key=lambda s: (s.split("@")[0], TARGETS.index(s.split("@")[1]))):
        fig = figures["targets"][sel_id]
        recipe, target = sel_id.removeprefix("select/").split("@")
        siblings = measured.setdefault(recipe, {}) if sibling_rule else {}
        names = [c["name"] for c in fig["candidates"]]
        ladder = [{"name": c["name"], **c.get("quantization", {}), **({"precision": c["precision"]} if "precision" in c else {})}
                  for c in fig["candidates"]]
        thr, predict = fig["thresholds"], rules(ladder)
        known_s: dict[str, Any] = {}
        known_v: dict[str, Any] = {}
        runs, seconds, missing = [], 0.0, None
        while missing is None:
            rows = walk(names, known_s, known_v, thr, predict, dict(siblings))
            pending = next((r for r in rows if r["state"] == "pending"), None)
            if pending is None:
                break
            n = pending["name"]
            if pending["why"] == "needs its CPU screen":
                if fig["screens"].get(n) is None:
                    missing = f"screen of {n}"
                known_s[n] = fig["screens"].get(n)
                continue
            if n not in fig["verifies"]:
                missing = f"simulator run of {n}"
                break
            known_v[n] = fig["verifies"][n]["result"]
            if not known_v[n].get("compile_refused"):
                runs.append(n)
                seconds += fig["verifies"][n]["simulator_s"]
        winner = next((r["name"] for r in rows if r["state"] == "passed"), None)
        if sibling_rule:
            siblings[target] = known_v
        total += seconds
        targets[sel_id] = {"winner": winner, "simulator_runs": runs, "simulator_s": round(seconds, 1),
                           "states": {r["name"]: r["state"] for r in rows}, "missing": missing,
                           "skipped": {r["name"]: r["why"] for r in rows if r["state"] in ("rejected_cpu", "predicted_fail")},
                           "disagrees": [r["disagrees"] for r in rows if "disagrees" in r]}
    base = figures["base"]
    runs = sum(len(t["simulator_runs"]) for t in targets.values())
    seconds = round(total, 1)
    winners = {k: t["winner"] for k, t in targets.items()}
    return {"targets": targets, "winners": winners,
            "verify_actions": {"base": base["simulator_runs"], "this tree": runs},
            "simulator_s": {"base": base["simulator_s"], "this tree": seconds,
                            "ratio": round(seconds / base["simulator_s"], 3) if base["simulator_s"] else None},
            # the base's selects, where they ran (a base stopped early has none: compare its verdicts by hand)
            "same_winners": all(winners[k] == w for k, w in base["winners"].items() if k in winners) if base["winners"] else None,
            "missing": sorted(k for k, t in targets.items() if t["missing"])}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(SEARCH_SET))
    ap.add_argument("--base", default="main", help="the code compared with (97436d3: before the staged search)")
    ap.add_argument("--workdir", help="keep the runs here; reuse a base run already here")
    ap.add_argument("--replay", metavar="OUT[,OUT...]", help="counting mode: this tree's search over the base run in "
                    "the first OUT (its measurements, no simulator; the others: earlier runs whose cache it restored), "
                    "against what the base ran: verify actions, simulator seconds, winners; prints and exits")
    ap.add_argument("--save", metavar="FILE", help="with --replay: also write the base's measurements read (screens, "
                    "verifies, simulator seconds) to FILE, which --figures replays without the OUT")
    ap.add_argument("--figures", metavar="FILE", help="counting mode over measurements saved by --save")
    ap.add_argument("--no-siblings", action="store_true", help="replay with auto: {siblings: false}")
    args = ap.parse_args()
    if args.replay or args.figures:
        if args.figures:
            figures = json.loads(Path(args.figures).read_text())
        else:
            out, *earlier = [Path(d) for d in args.replay.split(",")]
            figures = recorded(out, earlier)
            if args.save:
                Path(args.save).write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
        print(json.dumps(replay(figures, not args.no_siblings), indent=1))
        return 0
    names = args.models.split(",")
    try:
        for n in names:
            locate(n)
    except MissingModel as e:
        print(f"search_bench: skipped: {e}")
        return 0
    with tempfile.TemporaryDirectory(prefix="search_bench-") as tmp:
        root = Path(args.workdir or tmp)
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True,
                       capture_output=True)
        try:
            recipes = root / "recipes" if (root / "recipes").is_dir() else write_tree(root, names)
            commit = subprocess.run(["git", "-C", str(base), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
            results: dict[str, Any] = {"models": names, "targets": TARGETS, "base": f"{args.base} ({commit})",
                                       "load_before": os.getloadavg(), "cores": os.cpu_count()}
            kept = root / "old.json"
            # both builds at once unless the base's is kept: on a shared machine they see the same load (the
            # base runs longer, and alone at its end: its seconds there are the lower for it)
            with ThreadPoolExecutor(2) as pool:
                new = pool.submit(build, ROOT, recipes, root / "out-new", root / "cache-new")
                ran = json.loads(kept.read_text()) if kept.is_file() else build(
                    base, recipes, root / "out-old", root / "cache-old")
                kept.write_text(json.dumps(ran))
                results["old"] = {**ran, **counts(root / "out-old")}
                print("old:", json.dumps(results["old"], indent=1), flush=True)
                results["new"] = {**new.result(), **counts(root / "out-new")}
            print("new:", json.dumps(results["new"], indent=1), flush=True)
            results["load_after"] = os.getloadavg()
            results["cpu_vs_htp"] = cpu_vs_htp(root / "out-old")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    old, new = results["old"], results["new"]
    # the same winner wherever the base found one; where it found none (no fp16 or mixed rung before them), what
    # this tree found instead is listed
    kept_winners = {k: w for k, w in old["winners"].items() if w}
    assert all(new["winners"].get(k) == w for k, w in kept_winners.items()), (old["winners"], new["winners"])
    results["winners_found_where_base_had_none"] = {k: w for k, w in new["winners"].items() if k not in kept_winners}
    results["ratios"] = {"verify": round(new["seconds_by_kind"].get("verify", 0) / old["seconds_by_kind"].get("verify", 1), 3),
                         "simulator": round(new["simulator_s"] / max(old["simulator_s"], 1e-9), 3),
                         "wall": round(new["wall_s"] / old["wall_s"], 3)}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "search_bench.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("ratios", "cpu_vs_htp")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
