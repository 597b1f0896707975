"""Peak RSS and time per action kind against model size, from the records of real ctxbuild builds.

For each precision and size: a MatMul chain with external-data weights (tests/_big_models.py), built cold
(one SoC, verification on unless --no-verify), then restored into a fresh OUT from the local cache, with
`cp -r` of the same outputs as the baseline. Writes bench/results/memory_bench.json and prints a table.

    python bench/memory_bench.py                      # fp16 and qdq at 100 MB, 500 MB, 1 GB
    python bench/memory_bench.py --sizes 100 --precisions int8

Memory: a 1 GB qdq compile peaks near 4 GB; run it on a machine with that much free.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests._big_models import matmul_chain  # noqa: E402

# (dim, layers) per nominal size in MB; fp16 models hold float32 weights (4 bytes), qdq uint8 (1 byte).
SHAPES = {
    "fp16": {100: (2048, 6), 500: (4096, 8), 1000: (4096, 16), 2000: (8192, 8)},
    "int8": {100: (2048, 6), 500: (4096, 8), 1000: (4096, 16)},
    "qdq": {100: (4096, 6), 500: (8192, 8), 1000: (8192, 16)},
}
CTXBUILD = [sys.executable, "-m", "ctxbuild"]


def recipe(precision: str, verify: bool, bundle: bool) -> str:
    graphs = (["bundle:", "  - {name: prefill, model: prefill.onnx}", "  - {name: decode, model: big.onnx}"]
              if bundle else ["model: big.onnx"])
    lines = ["name: big", *graphs, f"precision: {precision}", "targets: [SM8650]",
             f"verify: {{enabled: {str(verify).lower()}, samples: 1, timeout_s: 1800}}"]
    if precision == "int8":
        lines.append("calibration: {random: true, samples: 2}")
    return "\n".join(lines) + "\n"


def run_one(precision: str, size: int, verify: bool, bundle: bool, work: Path) -> dict:
    dim, layers = SHAPES[precision][size]
    src = work / "recipes"
    src.mkdir()
    data = matmul_chain(src / "big.onnx", dim=dim, layers=layers, precision=precision)
    if bundle:  # a prefill graph (16 rows) with the decode graph's weights
        matmul_chain(src / "prefill.onnx", dim=dim, layers=layers, precision=precision, rows=16)
    (src / "big.yaml").write_text(recipe(precision, verify, bundle))
    env_cache = {"CTXBUILD_CACHE_DIR": str(work / "cache")}
    cold = _build(src, work / "out1", env_cache)
    records = _records(work / "out1")
    warm = _build(src, work / "out2", env_cache)
    start = time.monotonic()
    shutil.copytree(work / "out1" / "SM8650", work / "cp" / "SM8650")
    cp = time.monotonic() - start
    bins = list((work / "out1" / "SM8650").rglob("*.bin"))
    row = {"precision": precision, "bundle": bundle, "nominal_mb": size, "dim": dim, "layers": layers, "weights_bytes": data,
           "binary_bytes": sum(b.stat().st_size for b in bins), "cold_seconds": cold["seconds"],
           "driver_peak_rss": cold["driver_peak_rss"], "restore_seconds": warm["seconds"], "cp_seconds": round(cp, 3),
           "actions": {_label(r): {"peak_rss": r["peak_rss"], "estimate": r.get("memory_estimate"),
                                   "seconds": r["seconds"], "simulator_seconds": r.get("simulator_seconds")}
                       for r in records}}
    return row


def _label(record: dict) -> str:
    """The kind, plus which graph for the per-graph actions of a bundle (prepare/decode, verify/prefill...)."""
    rid = record["id"]
    graph = next((g for g in ("prefill", "decode") if g in rid), None)
    return f"{record['kind']}/{graph}" if graph and record["kind"] != "bundle" else record["kind"]


def _build(src: Path, out: Path, env: dict[str, str]) -> dict:
    import os

    start = time.monotonic()
    proc = subprocess.run([*CTXBUILD, "build", str(src), "-o", str(out)], env={**os.environ, **env},
                          capture_output=True, text=True, cwd=ROOT)
    seconds = round(time.monotonic() - start, 3)
    if proc.returncode:
        raise SystemExit(f"build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    return {"seconds": seconds, "driver_peak_rss": report["memory"]["driver_peak_rss"]}


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / ".ctxbuild" / "records").glob("*.json"))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 1000])
    ap.add_argument("--precisions", nargs="+", default=["fp16", "qdq"])
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--bundle", action="store_true", help="a prefill/decode bundle sharing every weight")
    ap.add_argument("--verify-max-mb", type=int, default=500, help="verify only models up to this size")
    args = ap.parse_args()
    rows = []
    for precision in args.precisions:
        for size in args.sizes:
            with tempfile.TemporaryDirectory(prefix="ctxbuild-membench-", dir="/tmp") as tmp:
                row = run_one(precision, size, not args.no_verify and size <= args.verify_max_mb, args.bundle,
                              Path(tmp))
            rows.append(row)
            print(_line(row), flush=True)
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    name = "_".join(["memory_bench", *args.precisions, *map(str, args.sizes)] + (["bundle"] if args.bundle else []))
    (results / f"{name}.json").write_text(json.dumps(rows, indent=2))


def _line(row: dict) -> str:
    mb = 1 << 20
    acts = " ".join(f"{k}={a['peak_rss'] // mb}MB/{a['seconds']:.1f}s" for k, a in sorted(row["actions"].items()))
    return (f"{row['precision']:5} {row['weights_bytes'] / mb:7.0f} MB weights -> {row['binary_bytes'] / mb:6.0f} MB bin | "
            f"{acts} | cold {row['cold_seconds']:.1f}s restore {row['restore_seconds']:.1f}s cp {row['cp_seconds']:.2f}s "
            f"driver {row['driver_peak_rss'] // mb}MB")


if __name__ == "__main__":
    main()
