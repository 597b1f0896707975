"""Benchmark of remote execution on a Dask cluster (not a test): the per-action overhead of running an action
on a worker (submit -> run there -> restore here) against running it locally, measured on one machine, and
a model of the speedup for M actions on K workers built from those measured per-action costs.

Usage: python bench/farm_bench.py [--models 10] [--reps 3]
Prints medians and writes bench/results/farm.json.

Workload: N tiny fp16 MLPs (bench/cache_bench.py's, distinct seeds) x 2 SoCs, --no-verify: N prepare + 2N
compile actions. Side by side, interleaved, --reps times each:
- local:  `ctxbuild build --no-cache -j1` into a fresh OUT.
- farm:   `ctxbuild build --executor tcp://... --remote-cache http://...` into a fresh OUT with an empty local
          cache, an empty nginx cache and empty worker caches, on a real `dask scheduler` + one `dask worker`
          (1 thread, so ninja's -j is 1 too) on this machine. Every action is a miss and runs on the worker.
- farm2:  the same with two workers (-j2), against `local -j2`: the model's check on a second point.
Per action (from OUT/.ctxbuild/records): `seconds` is the whole action process (key, run or submit, restore);
for farm runs `farm.seconds` is the worker's part (fetch inputs, run, publish). Overhead = farm - local.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.cache_bench import mlp, write_tree  # noqa: E402
from tests.dask_fixture import Cluster, start_cluster  # noqa: E402
from tests.nginx_fixture import start_nginx  # noqa: E402


def build(recipes: Path, out: Path, cache: Path, *extra: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "CTXBUILD_REMOTE_CACHE", "CTXBUILD_EXECUTOR")}
    env["CTXBUILD_CACHE_DIR"] = str(cache)
    cmd = [sys.executable, "-m", "ctxbuild", "build", str(recipes), "-o", str(out), "--no-verify", *extra]
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return dt


def action_times(out: Path) -> dict[str, dict[str, float]]:
    recs = {}
    for p in (out / ".ctxbuild" / "records").glob("*.json"):
        r = json.loads(p.read_text())
        recs[r["id"]] = {"kind": r["kind"], "seconds": r["seconds"],
                         "worker_seconds": (r.get("farm") or {}).get("seconds")}
        if r.get("source") != "run":
            raise SystemExit(f"{r['id']} was not run ({r.get('source')}): the measurement would be wrong")
    return recs


def empty(*dirs: Path) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ctxbuild-farm-bench-"))
    cluster: Cluster | None = None
    stop_nginx = None
    try:
        recipes = write_tree(root, args.models, mlp)
        url, stop_nginx = start_nginx(root / "nginx")
        cluster = start_cluster(root / "dask")
        cluster.add_workers({"w1": ("qnn=1", None)})
        worker_cache = cluster.tmp / "worker-cache"
        remote_data = root / "nginx" / "data"
        walls: dict[str, list[float]] = {}
        per_action: dict[str, list[dict[str, dict[str, float]]]] = {"local": [], "farm": []}

        def farm_run(tag: str, rep: int) -> None:
            empty(remote_data / "ac", remote_data / "cas", worker_cache / "ac", worker_cache / "cas")
            out = root / f"out-{tag}"
            walls.setdefault(tag, []).append(build(recipes, out, root / f"cache-{tag}-{rep}", "--executor",
                                                   cluster.address, "--remote-cache", url))
            if tag == "farm":
                per_action["farm"].append(action_times(out))

        farm_run("farm", -1)  # warm-up: the workers' fork servers and toolchain memo, page cache
        for rep in range(args.reps):
            walls.setdefault("local", []).append(build(recipes, root / "out-local", root / "unused", "--no-cache",
                                                       "-j1"))
            per_action["local"].append(action_times(root / "out-local"))
            farm_run("farm", rep)
        cluster.add_workers({"w2": ("qnn=1", None)})
        farm_run("farm2", -1)
        for rep in range(args.reps):
            walls.setdefault("local_j2", []).append(build(recipes, root / "out-local2", root / "unused", "--no-cache",
                                                          "-j2"))
            farm_run("farm2", rep)
        result = summarize(args.models, walls, per_action)
    finally:
        if cluster is not None:
            cluster.stop()
        if stop_nginx is not None:
            stop_nginx()
        shutil.rmtree(root, ignore_errors=True)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "farm.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def summarize(n: int, walls: dict[str, list[float]], per_action: dict[str, list[dict[str, dict[str, float]]]]
              ) -> dict[str, Any]:
    m = 3 * n
    wall = {k: med(v) for k, v in walls.items()}
    costs: dict[str, dict[str, float]] = {}
    for kind in ("prepare", "compile"):
        local = [a["seconds"] for run in per_action["local"] for a in run.values() if a["kind"] == kind]
        farm = [a["seconds"] for run in per_action["farm"] for a in run.values() if a["kind"] == kind]
        worker = [a["worker_seconds"] for run in per_action["farm"] for a in run.values() if a["kind"] == kind]
        costs[kind] = {"local": med(local), "farm": med(farm), "worker_part": med(worker),
                       "overhead": round(med(farm) - med(local), 3)}
    # Fixed cost per build (planning, connecting, manifest): the wall time the actions (run one at a time at
    # -j1) do not account for.
    sums = {tag: med([sum(a["seconds"] for a in run.values()) for run in per_action[tag]]) for tag in per_action}
    fixed = {"local": round(wall["local"] - sums["local"], 3), "farm": round(wall["farm"] - sums["farm"], 3)}
    t_local = statistics.median([a["seconds"] for run in per_action["local"] for a in run.values()])
    t_farm = statistics.median([a["seconds"] for run in per_action["farm"] for a in run.values()])

    def predict_farm(actions: int, k: int) -> float:
        return fixed["farm"] + math.ceil(actions / k) * t_farm

    def predict_local(actions: int, p: int) -> float:
        return fixed["local"] + math.ceil(actions / p) * t_local

    local_cores = os.cpu_count() or 1
    model = {f"M={mm}": {f"K={k}": round(predict_local(mm, local_cores) / predict_farm(mm, k), 2)
                         for k in (1, 2, 8, 32, 128)} for mm in (30, 300, 3000)}
    return {
        "actions": m, "wall_median_s": wall, "per_action_median_s": costs,
        "per_action_all_kinds_s": {"local": round(t_local, 3), "farm": round(t_farm, 3),
                                   "overhead": round(t_farm - t_local, 3)},
        "fixed_per_build_s": fixed,
        "model": {"formula": "T_farm(M,K) = fixed_farm + ceil(M/K) * t_farm;  T_local(M,P) = fixed_local + "
                             "ceil(M/P) * t_local;  speedup = T_local(M, P=local cores) / T_farm(M, K)",
                  "assumes": "independent actions of equal cost, one slot per worker, workers as fast as this "
                             "machine, the submitting side never the bottleneck",
                  "local_cores": local_cores, "speedup": model,
                  "check_K2": {"predicted_farm2_s": round(predict_farm(m, 2), 2), "measured_farm2_s": wall["farm2"],
                               "measured_local_j2_s": wall["local_j2"]}},
    }


if __name__ == "__main__":
    main()
