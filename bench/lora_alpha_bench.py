"""Benchmark: N LoRA adapters switched by alpha (adapters: {switch: alpha}: all resident in one binary, LoRA v3) against
the same N adapters as .onnx_adapter files over one base with LoRA slots (the default `adapters:` form), on the lora
example's MLP (16 x 64 -> 128 -> 64, int16), for N = 1, 2, 4, 8 at ranks 8 and 16, one target, cold (no cache), -j1.

Per case: the shipped bytes (binary + wrappers, + the .onnx_adapter files), the compile action's seconds, the
verification actions' seconds (alpha: verify + verify_alpha over its N + 2 rows; slots: verify + N verify_adapter and
N adapter actions), and the simulator's time per run (one sample, the median of --runs runs in one session, an
adapter on: a one-hot lora_alpha, or the .onnx_adapter bound with RunOptions). Build times are medians of --reps.

Usage: python bench/lora_alpha_bench.py [--reps R] [--runs K] [--ns 1,2,4,8] [--ranks 8,16] [--llm]
Writes bench/results/lora_alpha_bench.json and prints the table docs/bundles-and-lora.md shows (--llm: the llm
example's two adapters, alpha against .onnx_adapter, one cold build each: bench/results/lora_alpha_bench_llm.json).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

BENCHMARK = "LoRA alpha switching (one binary, N adapters) against N .onnx_adapter files: size, build, per-run time"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGET = "SM8650"

# one simulator session in a child: median seconds of `runs` runs with the adapter on
PER_RUN = """
import json, statistics, sys, time
import numpy as np, onnxruntime as ort
sys.path.insert(0, {root!r})
from ctxbuild.toolchain import installed
ctx, x, alpha, adapter, runs = {ctx!r}, np.load({sample!r})["x"], {alpha!r}, {adapter!r}, {runs}
sess = ort.InferenceSession(ctx, installed.session_options({{}}, cpu_fallback=True))
feed, ro = {{"x": x}}, None
if alpha is not None:
    feed["lora_alpha"] = np.asarray(alpha, np.float32)
if adapter is not None:
    lora = ort.LoraAdapter(); lora.Load(adapter); ro = ort.RunOptions(); ro.add_active_adapter(lora)
sess.run(None, feed, ro)
times = []
for _ in range(runs):
    t = time.perf_counter(); sess.run(None, feed, ro); times.append(time.perf_counter() - t)
print(json.dumps(statistics.median(times)))
"""


def _make_models() -> object:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "recipes" / "models" / "make_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def write_case(root: Path, n: int, rank: int) -> tuple[Path, Path]:
    """(alpha recipe dir, slots recipe dir) for N adapters of `rank`, over the example's base (same weights)."""
    from safetensors.numpy import save_file

    mm = _make_models()
    mm.LORA_RANK = rank  # lora_mlp's slots and lora_weights' tensors take it
    models = root / "models"
    (models / "calib").mkdir(parents=True)
    onnx.save(mm.lora_base(np.random.default_rng(12)), models / "base.onnx")
    onnx.save(mm.lora_mlp(np.random.default_rng(12)), models / "slots.onnx")
    rng = np.random.default_rng(3)
    for i in range(4):
        np.savez(models / "calib" / f"s{i}.npz", x=rng.standard_normal((1, 16, 64)).astype(np.float32))
    for i in range(n):  # the MatMul layout and slot names both forms read (layer1.lora_A [64, r], ...)
        save_file(mm.lora_weights(np.random.default_rng(100 + i)), str(models / f"a{i}.safetensors"))
    files = "".join(f"    - {{name: a{i}, file: {models}/a{i}.safetensors}}\n" for i in range(n))
    common = f"precision: int16\ncalibration: {{dir: {models}/calib}}\ntargets: [{TARGET}]\n"
    alpha, slots = root / "alpha", root / "slots"
    alpha.mkdir()
    slots.mkdir()
    (alpha / "bench.yaml").write_text(f"model: {models}/base.onnx\n{common}adapters:\n  switch: alpha\n  files:\n{files}")
    (slots / "bench.yaml").write_text(f"model: {models}/slots.onnx\n{common}adapters:\n  slots: ['*lora_A', '*lora_B']\n"
                                      f"  scaling: lora_scale\n  files:\n{files}")
    return alpha, slots


def build(tree: Path, out: Path, env: dict[str, str]) -> float:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", "-j1", "-o", str(out), str(tree)], env=env,
                       capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"failed: {tree}\n{p.stdout}\n{p.stderr}")
    return time.perf_counter() - t


def action_seconds(out: Path) -> dict[str, float]:
    """Seconds per action kind, from the records (each action's own run time)."""
    by_kind: dict[str, float] = {}
    for rec in (out / ".ctxbuild" / "records").glob("*.json"):
        r = json.loads(rec.read_text())
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r["seconds"]
    return by_kind


def per_run(out: Path, n: int, route: str, runs: int, sample: Path, env: dict[str, str]) -> float:
    d = out / TARGET / "bench"
    code = PER_RUN.format(root=str(ROOT), ctx=str(d / "bench_ctx.onnx"), sample=str(sample), runs=runs,
                          alpha=[1.0] + [0.0] * (n - 1) if route == "alpha" else None,
                          adapter=str(d / "adapters" / "a0.onnx_adapter") if route == "slots" else None)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def shipped(out: Path) -> int:
    d = out / TARGET / "bench"
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.name.endswith(".json"))


def llm_case(root: Path, env: dict[str, str]) -> list[dict]:
    """The llm example's two adapters (rank 4, q_proj/v_proj of 4 layers, 2 parts, w8a16): examples/llm_alpha.yaml
    against recipes/llm_lora.yaml (the same adapters as .onnx_adapter files over LoRA slots), one cold build each.
    The part binaries are multi-graph: the simulator cannot run them, so no per-run figure."""
    models = ROOT / "recipes" / "models"
    rows = []
    for route, src in (("alpha", ROOT / "examples" / "llm_alpha.yaml"), ("slots", ROOT / "recipes" / "llm_lora.yaml")):
        tree = root / f"llm-{route}"
        tree.mkdir()
        text = src.read_text().replace("../recipes/models/", f"{models}/").replace(" models/", f" {models}/")
        (tree / src.name).write_text(text)
        out = root / f"llm-out-{route}"
        wall = build(tree, out, env)
        s = action_seconds(out)
        d = next((out / TARGET).iterdir())
        rows.append({"route": route, "adapters": 2, "build_seconds": round(wall, 3),
                     "compile_seconds": round(s.get("bundle", 0.0), 3),
                     "verify_seconds": round(sum(v for k, v in s.items() if k in ("llm_eval", "adapter")), 3),
                     "binaries_bytes": sum(p.stat().st_size for p in d.glob("*_qnn.bin")),
                     "adapter_files_bytes": sum(p.stat().st_size for p in d.glob("adapters/*.onnx_adapter"))})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--ns", default="1,2,4,8")
    ap.add_argument("--ranks", default="8,16")
    ap.add_argument("--llm", action="store_true", help="the llm example's two adapters instead (one build each)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ctxbuild-lora-alpha-bench-"))
    env = {**os.environ, "CTXBUILD_NO_CACHE": "1", "CTXBUILD_CACHE_DIR": str(root / "cache")}
    env.pop("MAKEFLAGS", None)
    if args.llm:
        (HERE / "results").mkdir(exist_ok=True)
        result = {"target": TARGET, "load_average": os.getloadavg(), "rows": llm_case(root, env)}
        (HERE / "results" / "lora_alpha_bench_llm.json").write_text(json.dumps(result, indent=2))
        return
    rows = []
    for rank in map(int, args.ranks.split(",")):
        for n in map(int, args.ns.split(",")):
            case = root / f"r{rank}-n{n}"
            trees = dict(zip(("alpha", "slots"), write_case(case, n, rank)))
            for route, tree in trees.items():
                walls, compiles, verifies, outs = [], [], [], []
                for rep in range(args.reps):
                    out = case / f"out-{route}-{rep}"
                    walls.append(build(tree, out, env))
                    s = action_seconds(out)
                    compiles.append(s.get("compile", 0.0))
                    verifies.append(sum(v for k, v in s.items() if k.startswith("verify") or k == "adapter"))
                    outs.append(out)
                run_s = per_run(outs[0], n, route, args.runs, case / "models" / "calib" / "s0.npz", env)
                rows.append({"rank": rank, "adapters": n, "route": route, "shipped_bytes": shipped(outs[0]),
                             "build_seconds": round(statistics.median(walls), 3),
                             "compile_seconds": round(statistics.median(compiles), 3),
                             "verify_seconds": round(statistics.median(verifies), 3),
                             "per_run_ms": round(run_s * 1e3, 3)})
                print(json.dumps(rows[-1]), flush=True)
    result = {"target": TARGET, "reps": args.reps, "runs": args.runs, "machine": f"{os.cpu_count()}-core x86_64",
              "load_average": os.getloadavg(), "rows": rows}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "lora_alpha_bench.json").write_text(json.dumps(result, indent=2))
    print(table(rows))


def table(rows: list[dict]) -> str:
    """The markdown table of docs/bundles-and-lora.md: alpha against .onnx_adapter per (rank, N)."""
    by = {(r["rank"], r["adapters"], r["route"]): r for r in rows}
    head = ("| rank | N | binary + wrappers (+ adapters), KiB: alpha / .onnx_adapter | compile s | verify s | "
            "simulator per run, ms |")
    lines = [head, "|---|---|---|---|---|---|"]
    for rank, n in sorted({(r["rank"], r["adapters"]) for r in rows}):
        a, s = by[(rank, n, "alpha")], by[(rank, n, "slots")]
        lines.append(f"| {rank} | {n} | {a['shipped_bytes'] / 1024:.0f} / {s['shipped_bytes'] / 1024:.0f} | "
                     f"{a['compile_seconds']:.2f} / {s['compile_seconds']:.2f} | "
                     f"{a['verify_seconds']:.2f} / {s['verify_seconds']:.2f} | "
                     f"{a['per_run_ms']:.2f} / {s['per_run_ms']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
