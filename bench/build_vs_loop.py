"""Benchmark: `ctxbuild build` of N models x 2 targets, cold, against a plain in-process Python loop making
the same onnxruntime calls (bench/loop_baseline.py). Runs alternate in one go; medians are reported.

Usage: python bench/build_vs_loop.py [--models N] [--size PX] [--reps R]
Writes bench/results/build_vs_loop-<size>.json. Verification is off (the loop does not verify) and the
cache is off (cold means cold).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import models  # noqa: E402

BENCHMARK = "cold ctxbuild build vs an in-process onnxruntime loop, -j1 and -j2"
TARGETS = ["SM8650", "SM8750"]
# The driver run in-process so its own peak RSS (not ninja's or the actions') can be read afterwards.
DRIVER = ("import resource, sys; from ctxbuild.cli.main import main; rc = main(sys.argv[1:]); "
          "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return dt, p.stderr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    models.SIZE = args.size
    root = Path(tempfile.mkdtemp(prefix="ctxbuild-bench-"))
    recipes = models.write_tree(root, args.models, TARGETS)
    env = {**os.environ, "CTXBUILD_NO_CACHE": "1", "CTXBUILD_CACHE_DIR": str(root / "cache")}
    env.pop("MAKEFLAGS", None)
    py = sys.executable
    build = [py, "-c", DRIVER, "build", str(recipes), "--no-verify", "-o"]
    results: dict[str, list[float]] = {"loop": [], "ctxbuild_j1": [], "ctxbuild_j2": []}
    rss: list[int] = []
    # warm-up: page cache, the toolchain memo (a one-time ~0.3 s per toolchain, not per build)
    timed(build + [str(root / "warm"), "-j1"], env)
    for _ in range(args.reps):
        for name in results:
            out = root / f"out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            if name == "loop":
                dt, _ = timed([py, str(HERE / "loop_baseline.py"), str(recipes), str(out), *TARGETS], env)
            else:
                dt, err = timed(build + [str(out), "-j" + name[-1]], env)
                rss += [int(ln.split()[1]) for ln in err.splitlines() if ln.startswith("MAXRSS_KB")]
            results[name].append(dt)
    noop = [timed(build + [str(root / "out-ctxbuild_j1"), "-j1"], env)[0] for _ in range(10)]
    med = {k: statistics.median(v) for k, v in results.items()}
    report = {
        "models": args.models, "size": args.size, "targets": TARGETS, "reps": args.reps,
        "median_s": med, "runs_s": results,
        "ratio_serial": med["ctxbuild_j1"] / med["loop"], "ratio_j2": med["ctxbuild_j2"] / med["loop"],
        "noop_median_s": statistics.median(noop), "driver_peak_rss_mb": max(rss) / 1024,
        "model_bytes": (recipes / "models" / "m0.onnx").stat().st_size,
    }
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"build_vs_loop-{args.size}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "runs_s"}, indent=2))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
