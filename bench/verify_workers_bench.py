"""Benchmark: verify time against compile time in a plain build of real public models, one simulator child
(CTXBUILD_VERIFY_WORKERS=1, the code before) against several side by side (verify/sample_workers.py).

Per model (bench/real_models/models.py) and repetition, the two variants interleaved: a cold build (fresh OUT,
--no-cache, -j2) of one `precision: w8a16` recipe for one SoC with 4 verification samples; from the action
records the compile seconds, the verify action's seconds, its simulator seconds (the runs) and, for a failing
verification, the rest (the CPU-side failure hint). The simulator outputs must be the same (asserted: the
verify result files are compared byte for byte). Medians over --reps.

Usage: python bench/verify_workers_bench.py [--models ppocr_cls,ppocr_rec,ppocr_det] [--workers 2] [--reps 2]
Writes bench/results/verify_workers.json. Needs the real-model packages.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.real_models.inputs import write_samples  # noqa: E402
from bench.real_models.models import MODELS, locate  # noqa: E402

TARGET, CALIBRATION, VERIFY = "SM8650", 8, 4


def write_recipe(root: Path, name: str) -> Path:
    rec = root / name
    m = MODELS[name]
    write_samples(name, rec / "cal", CALIBRATION)
    write_samples(name, rec / "verify", VERIFY, first_seed=1000)
    (rec / f"{name}.yaml").write_text(
        f"model: {locate(name)}\ninputs: {{{m.input}: {list(m.shape)}}}\nprecision: w8a16\n"
        f"calibration: {{dir: cal}}\ntargets: [{TARGET}]\n"
        f"verify: {{dir: verify, samples: {VERIFY}, timeout_s: 1800}}\n")
    return rec


def build(rec: Path, out: Path, workers: str) -> dict[str, Any]:
    env = {**os.environ, "CTXBUILD_VERIFY_WORKERS": workers}
    env.pop("MAKEFLAGS", None)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(rec), "-o", str(out), "-j2", "--no-cache"],
                   capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    recs = {r["kind"]: r for r in (json.loads(f.read_text()) for f in (out / ".ctxbuild" / "records").glob("*.json"))}
    v, c = recs["verify"], recs["compile"]
    return {"wall_s": wall, "compile_s": c["seconds"], "verify_s": v["seconds"], "simulator_s": v["simulator_seconds"],
            "hint_s": v["seconds"] - v["simulator_seconds"] - v.get("reference_seconds", 0.0)
            if v["status"] == "failed" else 0.0,
            "workers": v.get("simulator_workers"), "passed": v["result"].get("passed"),
            "result": json.dumps(v["result"], sort_keys=True)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="ppocr_cls,ppocr_rec,ppocr_det")
    ap.add_argument("--workers", default="2")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    variants = {"serial": "1", "parallel": args.workers}
    rows = []
    with tempfile.TemporaryDirectory(prefix="verify-workers-") as tmp:
        root = Path(tmp)
        for name in args.models.split(","):
            rec = write_recipe(root / "recipes", name)
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
            for rep in range(args.reps):
                for variant, workers in variants.items():
                    r = build(rec, root / f"out-{name}-{variant}-{rep}", workers)
                    runs[variant].append(r)
                    print(f"{name} {variant} rep {rep}: compile {r['compile_s']:.1f} s, verify {r['verify_s']:.1f} s "
                          f"(simulator {r['simulator_s']:.1f} s, {r['workers']} children)", flush=True)
            results = {r["result"] for v in runs.values() for r in v}
            assert len(results) == 1, f"{name}: the verify results differ between variants"
            row: dict[str, Any] = {"model": name, "passed": runs["serial"][0]["passed"]}
            for variant, rs in runs.items():
                med = {k: round(statistics.median(r[k] for r in rs), 2)
                       for k in ("wall_s", "compile_s", "verify_s", "simulator_s", "hint_s")}
                med["verify_per_compile"] = round(med["verify_s"] / med["compile_s"], 2)
                med["simulator_per_compile"] = round(med["simulator_s"] / med["compile_s"], 2)
                row[variant] = med
            row["simulator_parallel_per_serial"] = round(row["parallel"]["simulator_s"] / row["serial"]["simulator_s"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    dest = HERE / "results" / "verify_workers.json"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps({"target": TARGET, "samples": VERIFY, "reps": args.reps, "workers": args.workers,
                                "load_average": os.getloadavg(), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
