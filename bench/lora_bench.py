"""Benchmark: N LoRA adapters on one base compiled once (`adapters:` recipe) against N full builds (one recipe
per adapter, the adapter merged into the model's weights), int16, cold, no cache, no verification.

Also: adding one more adapter to the compiled-once tree against one more full build. Runs alternate in one
go; medians are reported. Output sizes are the shipped files per target (wrappers, binaries, .onnx_adapter).

Usage: python bench/lora_bench.py [--adapters N] [--dim D] [--hidden H] [--reps R]
Writes bench/results/lora_bench.json.
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
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
TARGET = "SM8650"


def _make_models() -> object:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "recipes" / "models" / "make_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def write_trees(root: Path, n: int, d: int, h: int) -> tuple[Path, Path, Path]:
    """(compiled-once tree, full-builds tree, the extra adapter's file)."""
    mm = _make_models()
    base = mm.lora_mlp(np.random.default_rng(1), d=d, h=h)
    models = root / "models"
    (models / "calib").mkdir(parents=True)
    onnx.save(base, models / "base.onnx")
    rng = np.random.default_rng(2)
    for i in range(4):
        np.savez(models / "calib" / f"s{i}.npz", x=rng.standard_normal((1, 16, d)).astype(np.float32))
    adapters = {f"a{i}": mm.lora_weights(np.random.default_rng(10 + i), d=d, h=h) for i in range(n + 1)}
    once, full = root / "once", root / "full"
    once.mkdir()
    full.mkdir()
    for name, w in adapters.items():
        np.savez(models / f"{name}.npz", **w)
        merged = onnx.load(models / "base.onnx")
        for init in merged.graph.initializer:
            if init.name in w:
                init.CopyFrom(numpy_helper.from_array(w[init.name], init.name))
        onnx.save(merged, models / f"merged_{name}.onnx")
    common = f"precision: w8a16\ncalibration: {{dir: {models}/calib}}\ntargets: [{TARGET}]\n"
    for name in list(adapters)[:n]:
        (full / f"{name}.yaml").write_text(f"model: {models}/merged_{name}.onnx\n{common}")
    files = "".join(f"    - {{name: {name}, file: {models}/{name}.npz}}\n" for name in list(adapters)[:n])
    # calibrate pinned to the first N: an adapter added later is outside the set and never recompiles the base
    (once / "lora.yaml").write_text(f"model: {models}/base.onnx\n{common}adapters:\n  slots: ['*lora_A', '*lora_B']\n"
                                    f"  calibrate: [{', '.join(list(adapters)[:n])}]\n  files:\n{files}")
    return once, full, models / f"a{n}.npz"


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return time.perf_counter() - t


def _last_build(out: Path) -> dict[str, str]:
    return json.loads((out / ".ctxbuild" / "last_build.json").read_text())["actions"]


def _action_seconds(out: Path, ids: list[str]) -> float:
    """The actions' own time from their records (the rest of a build is planning and process start-up)."""
    from ctxbuild.layout import record_path

    return sum(json.loads(record_path(out, i).read_text())["seconds"] for i in ids)


def shipped_bytes(out: Path) -> int:
    return sum(p.stat().st_size for p in (out / TARGET).rglob("*") if p.is_file() and not p.name.endswith(".json"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ctxbuild-lora-bench-"))
    once, full, extra = write_trees(root, args.adapters, args.dim, args.hidden)
    env = {**os.environ, "CTXBUILD_NO_CACHE": "1", "CTXBUILD_CACHE_DIR": str(root / "cache")}
    env.pop("MAKEFLAGS", None)
    build = [sys.executable, "-m", "ctxbuild", "build", "--no-verify", "-j1", "-o"]
    times: dict[str, list[float]] = {"once": [], "full": [], "once_add_one": [], "full_add_one": []}
    sizes: dict[str, int] = {}
    ran: dict[str, list[str]] = {}  # the actions the add-one builds ran
    action_s: dict[str, list[float]] = {"once_add_one": [], "full_add_one": []}  # their own seconds, summed
    timed(build + [str(root / "warm"), str(full)], env)  # page cache, the toolchain memo
    once_text = (once / "lora.yaml").read_text()
    for rep in range(args.reps):
        for name, tree in (("once", once), ("full", full)):
            out = root / f"{name}{rep}"
            times[name].append(timed(build + [str(out), str(tree)], env))
            sizes[name] = shipped_bytes(out)
        # one more adapter: the compiled-once tree re-plans and runs only the new adapter's action
        (once / "lora.yaml").write_text(once_text + f"    - {{name: extra, file: {extra}}}\n")
        times["once_add_one"].append(timed(build + [str(root / f"once{rep}"), str(once)], env))
        ran["once_add_one"] = sorted(_last_build(root / f"once{rep}"))
        action_s["once_add_one"].append(_action_seconds(root / f"once{rep}", ran["once_add_one"]))
        (once / "lora.yaml").write_text(once_text)
        (full / "extra.yaml").write_text((full / "a0.yaml").read_text().replace("merged_a0", f"merged_{extra.stem}"))
        times["full_add_one"].append(timed(build + [str(root / f"full{rep}"), str(full)], env))
        ran["full_add_one"] = sorted(_last_build(root / f"full{rep}"))
        action_s["full_add_one"].append(_action_seconds(root / f"full{rep}", ran["full_add_one"]))
        (full / "extra.yaml").unlink()
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    result = {"adapters": args.adapters, "dim": args.dim, "hidden": args.hidden, "reps": args.reps, "target": TARGET,
              "base_model_bytes": (root / "models" / "base.onnx").stat().st_size, "seconds": times,
              "median_seconds": med, "shipped_bytes": sizes, "add_one_ran": ran,
              "add_one_action_seconds_median": {k: round(statistics.median(v), 3) for k, v in action_s.items()},
              "ratios": {"build_once_vs_full": round(med["once"] / med["full"], 3),
                         "add_one_once_vs_full": round(med["once_add_one"] / med["full_add_one"], 3),
                         "size_once_vs_full": round(sizes["once"] / sizes["full"], 3)}}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "lora_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("median_seconds", "shipped_bytes", "ratios", "add_one_ran",
                                                   "add_one_action_seconds_median")}, indent=2))


if __name__ == "__main__":
    main()
