"""Benchmark of a second toolchain (not a test): what provisioning one costs, and what building the examples
for two runtimes costs against one.

Usage: python bench/toolchain_bench.py [--reps 5] [--provision-reps 3]
Prints medians and writes bench/results/toolchain.json.

- provision: `ctxbuild toolchain provision 2.3.0` into an empty toolchains dir, wheels from pip's cache
  (as on a CI machine that provisioned once before; the first download from PyPI is not timed here).
- cold:  the examples (recipes/, verification on) into a fresh OUT with an empty cache, built with the installed
  toolchain only (baseline) and with `toolchain: [installed, "2.3.0"]` in the directory defaults (every recipe
  a second time, for QAIRT 2.47), the toolchain already provisioned.
- noop:  `ctxbuild build` again in each up-to-date OUT. Goal (issue 17): unchanged within noise.
Runs alternate baseline / two-toolchain, so load on the machine hits both alike. Wall times are medians.
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

BENCHMARK = "a second toolchain: provisioning time, cold and no-op builds of the examples for two runtimes (issue 17)"
HERE = Path(__file__).resolve().parent
CTXBUILD = [sys.executable, "-m", "ctxbuild"]


def _timed(args: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    p = subprocess.run(args, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr[-2000:]}")
    return time.perf_counter() - t


def _tree(dst: Path, two: bool) -> Path:
    tree = dst / "recipes"
    shutil.copytree(HERE.parent / "recipes", tree, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    if two:  # the single-graph recipes for the installed toolchain and for QAIRT 2.47, as in docs/deploy.md
        for f in tree.glob("*.yaml"):
            if f.name != "_defaults.yaml" and "bundle:" not in f.read_text() and "multi_soc" not in f.read_text():
                f.write_text(f.read_text() + '\ntoolchain: [installed, "2.3.0"]\n')
    return tree


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--provision-reps", type=int, default=3)
    args = ap.parse_args()
    base_env = {**os.environ}
    base_env.pop("MAKEFLAGS", None)
    results: dict[str, object] = {"benchmark": BENCHMARK, "cpus": os.cpu_count()}

    with tempfile.TemporaryDirectory(prefix="ctxbuild-tc-bench-") as tmp_s:
        tmp = Path(tmp_s)
        prov = []
        for i in range(args.provision_reps):
            env = {**base_env, "CTXBUILD_TOOLCHAINS_DIR": str(tmp / f"tc{i}")}
            prov.append(_timed([*CTXBUILD, "toolchain", "provision", "2.3.0"], env))
        results["provision_s"] = {"median": round(statistics.median(prov), 2), "runs": [round(x, 2) for x in prov]}
        print(f"provision onnxruntime-qnn 2.3.0 (pip cache warm): median {statistics.median(prov):.1f} s")

        subprocess.run([*CTXBUILD, "toolchain", "provision", "2.3.0"], env=base_env, check=True, capture_output=True)
        cold: dict[str, list[float]] = {"one": [], "two": []}
        noop: dict[str, list[float]] = {"one": [], "two": []}
        for rep in range(max(1, args.reps // 2)):
            for label in ("one", "two"):
                d = tmp / f"{label}{rep}"
                tree = _tree(d, label == "two")
                env = {**base_env, "CTXBUILD_CACHE_DIR": str(d / "cache")}
                cold[label].append(_timed([*CTXBUILD, "build", str(tree), "-o", str(d / "out")], env))
        for _ in range(args.reps):
            for label in ("one", "two"):
                d = tmp / f"{label}0"
                env = {**base_env, "CTXBUILD_CACHE_DIR": str(d / "cache")}
                noop[label].append(_timed([*CTXBUILD, "build", str(d / "recipes"), "-o", str(d / "out")], env))
        for name, runs in (("cold", cold), ("noop", noop)):
            one, two = statistics.median(runs["one"]), statistics.median(runs["two"])
            results[name] = {"installed_only_s": round(one, 3), "two_toolchains_s": round(two, 3),
                             "ratio": round(two / one, 2), "runs": runs}
            print(f"{name}: installed only {one:.3f} s, installed + 2.3.0 {two:.3f} s (x{two / one:.2f})")
    out = HERE / "results" / "toolchain.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
