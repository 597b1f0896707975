"""Where verification time goes, and what the verify memo saves (not a test).

Usage: python bench/verify_cost.py [--models 2] [--reps 3] [--real]
Prints medians and writes bench/results/verify_cost.json.

Workload: N mid-sized CNNs (bench/models.py, 160x160) at int16 for SM8650 and SM8750, 4 verification samples
each; with --real also PP-OCRv4's text recognizer (tests/real_models.py, needs `.[real-models]`) for SM8650.
Every figure is the wall time of a whole `ctxbuild build` process, median over --reps, the two variants run
side by side (interleaved):

- breakdown: from the records of a cold build, per verify action: CPU reference, simulator session creation
  (loading the context binary), simulator runs (all samples in one session), the rest (process, sample
  loading, metrics, coverage).
- rethreshold: every recipe's verify.min_cosine changed in an up-to-date OUT, so every verify action re-runs
  (its key changed) while every binary stays byte-identical. "before" is CTXBUILD_VERIFY_MEMO=0, i.e. the
  simulator and the CPU reference run again; "after" restores their outputs from the cache by digest.
- search: a cold `precision: auto` build (3 candidates x 2 targets) with an empty cache, memo off vs on:
  the CPU reference is computed once per model instead of once per candidate and target.
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

from bench.models import write_tree  # noqa: E402
from tests.real_models import recognizer, write_text_lines  # noqa: E402

TARGETS = ["SM8650", "SM8750"]


def build(tree: Path, out: Path, cache: Path, memo: bool) -> float:
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache), "CTXBUILD_VERIFY_MEMO": "1" if memo else "0"}
    env.pop("MAKEFLAGS", None)
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(tree), "-o", str(out)], env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"build failed:\n{p.stdout}\n{p.stderr}")
    return time.monotonic() - start


def set_threshold(tree: Path, value: float) -> None:
    for f in tree.glob("*.yaml"):
        lines = [ln for ln in f.read_text().splitlines() if not ln.startswith("verify:")]
        src = "dir: rec_ver, " if f.name == "rec.yaml" else ""  # the recognizer's rendered text lines
        # thresholds low enough to pass on random bench weights: this measures time, not accuracy
        f.write_text("\n".join(lines) + f"\nverify: {{{src}samples: 4, min_cosine: {value}, min_snr_db: 0, "
                     "timeout_s: 1200}\n")


def add_real(tree: Path) -> None:
    model = recognizer()
    if model is None:
        raise SystemExit("--real needs the recognizer: pip install -e '.[real-models]'")
    write_text_lines(tree / "rec_cal", 8, 0)
    write_text_lines(tree / "rec_ver", 4, 100)
    (tree / "rec.yaml").write_text(f"model: {model}\ninputs: {{x: [1, 3, 48, 320]}}\nprecision: w8a16\n"
                                   "calibration: {dir: rec_cal}\ntargets: [SM8650]\n")


def breakdown(out: Path) -> dict[str, dict[str, float]]:
    rows = {}
    for p in sorted((out / ".ctxbuild" / "records").glob("verify.*.json")):
        r = json.loads(p.read_text())
        parts = {k: r.get(k) for k in ("seconds", "reference_seconds", "simulator_load_seconds",
                                       "simulator_run_seconds")}
        if None in parts.values():
            continue
        parts["other_seconds"] = round(parts["seconds"] - parts["reference_seconds"]
                                       - parts["simulator_load_seconds"] - parts["simulator_run_seconds"], 3)
        rows[r["id"]] = parts
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--real", action="store_true")
    args = ap.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="ctxbuild-verify-bench-") as tmp:
        root = Path(tmp)
        tree = write_tree(root, args.models, TARGETS)
        if args.real:
            add_real(tree)
        set_threshold(tree, 0.5)
        out, cache = root / "out", root / "cache"
        build(tree, out, cache, memo=True)
        results["breakdown"] = breakdown(out)

        times: dict[str, list[float]] = {"before": [], "after": []}
        value = 0.5
        for _ in range(args.reps):
            for variant in ("before", "after"):
                value = round(value - 0.0001, 4)  # a new threshold each run: every verify re-runs
                set_threshold(tree, value)
                times[variant].append(build(tree, out, cache, memo=variant == "after"))
        results["rethreshold"] = {k: statistics.median(v) for k, v in times.items()}

        search = root / "search"
        shutil.copytree(tree / "models", search / "models")
        for f in tree.glob("m*.yaml"):
            (search / f.name).write_text(f.read_text().replace("precision: w8a16", "precision: auto"))
        times = {"before": [], "after": []}
        for i in range(args.reps):
            for variant in ("before", "after"):
                times[variant].append(build(search, root / f"sout{i}{variant}", root / f"scache{i}{variant}",
                                            memo=variant == "after"))
        results["search"] = {k: statistics.median(v) for k, v in times.items()}
    for name in ("rethreshold", "search"):
        r = results[name]
        print(f"{name:12s} before {r['before']:7.2f} s   after {r['after']:7.2f} s   "
              f"ratio {r['after'] / r['before']:.2f}")
    print("verify breakdown (cold build, seconds):")
    for aid, parts in results["breakdown"].items():
        print(f"  {aid:40s} " + "  ".join(f"{k.replace('_seconds', '')} {v:.2f}" for k, v in parts.items()))
    dest = HERE / "results" / "verify_cost.json"
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps({"args": vars(args), **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
