"""Benchmark of the action cache (not a test): no-op rebuilds, restores into a fresh OUT, one model changed,
each with the local cache and through a remote one (nginx), all run side by side (interleaved) in one go.

Usage: python bench/cache_bench.py [--models 50] [--reps 5] [--big-models 0] [--big-mb 40]
Prints medians and writes bench/results/cache.json.

Workload: N tiny fp16 MLPs (distinct seeds: nothing is shared) x 2 SoCs = 2N compile targets; verification
off (--no-verify) so that only prepare and compile actions run. Every figure is the wall time of a whole
`ctxbuild build` process (interpreter start included), median over --reps runs. What is measured:

- noop:          `ctxbuild build` in an up-to-date OUT. Floor: `ninja -n` in that OUT (ninja's own stat walk).
- cold:          fresh OUT, empty cache (outputs are stored into the cache as they are built).
- restore:       fresh OUT, warm cache: every action restored. Compared to `cp -r` of the same outputs
                 (the SoC directories and .ctxbuild/work, where intermediate models live).
- one_changed:   one model's bytes changed (a new seed each repetition, so never in the cache) in a warm,
                 up-to-date OUT of all N recipes: its prepare and 2 compiles run, everything else stays.
                 Baseline ("own actions"): `ctxbuild build --no-cache` of a directory holding just that
                 recipe and model, into a fresh OUT: the same three actions and nothing else.
- the same through a remote cache: nginx on loopback (bench/nginx.start_nginx), an empty local
  cache every time; `cold_remote` starts from an empty server too.

--big-models M adds a second, byte-heavy workload (M models of ~--big-mb MB each) for restore vs cp -r,
where the copy itself rather than per-action overhead dominates.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.nginx import start_nginx  # noqa: E402

BENCHMARK = "action cache: no-op, restore, one model changed; local and remote (nginx)"
TARGETS = ["SM8650", "SM8750"]
GOALS = {"noop": ("noop", "<=", 0.3, "s"), "restore": ("restore/cp_r", "<=", 1.5, "x"),
         "one_changed": ("one_changed/own_actions", "<=", 1.1, "x")}


def mlp(seed: int, d: int = 64, h: int = 256) -> onnx.ModelProto:
    """The example recipes' MLP (recipes/models/make_models.py), seeded per model."""
    rng = np.random.default_rng(seed)

    def init(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [init("w1", (d, h), 0.1), init("b1", (h,), 0.02), init("w2", (h, d), 0.1), init("b2", (d,), 0.02)]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Sigmoid", ["a1"], ["s1"]), helper.make_node("Mul", ["a1", "s1"], ["g1"]),
             helper.make_node("MatMul", ["g1", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def big_mlp(seed: int, mb: int) -> onnx.ModelProto:
    h = 4096
    d = max(64, mb * 2**20 // (4 * 2 * h))  # two d x h fp32 matrices ~ mb MB
    return mlp(seed, d=d, h=h)


def write_tree(root: Path, n: int, model: Callable[[int], onnx.ModelProto]) -> Path:
    rec = root / "recipes"
    (rec / "models").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        onnx.save(model(1000 + i), rec / "models" / f"m{i:02d}.onnx")
        (rec / f"m{i:02d}.yaml").write_text(f"model: models/m{i:02d}.onnx\nprecision: fp16\n"
                                             f"targets: [{', '.join(TARGETS)}]\n")
    return rec


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.samples: dict[str, list[float]] = {}
        self.env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "CTXBUILD_REMOTE_CACHE",
                                                                     "CTXBUILD_NO_CACHE")}
        self._n = 0

    def fresh(self, name: str) -> Path:
        self._n += 1
        p = self.root / f"{name}-{self._n}"
        shutil.rmtree(p, ignore_errors=True)
        return p

    def run(self, cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> float:
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=cwd, env={**self.env, **(env or {})}, capture_output=True, text=True)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return dt

    def build(self, recipes: Path, out: Path, cache: Path | None, *extra: str, remote: str | None = None) -> float:
        cmd = [sys.executable, "-m", "ctxbuild", "build", str(recipes), "-o", str(out), "--no-verify", *extra]
        env = {"CTXBUILD_CACHE_DIR": str(cache or self.root / "unused-cache")}
        if cache is None:
            cmd.append("--no-cache")
        if remote:
            cmd += ["--remote-cache", remote]
        return self.run(cmd, env=env)

    def sample(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds)


def sources(out: Path) -> dict[str, int]:
    actions = json.loads((out / ".ctxbuild" / "last_build.json").read_text())["actions"]
    counts: dict[str, int] = {}
    for v in actions.values():
        counts[v] = counts.get(v, 0) + 1
    return counts


def expect(out: Path, want: dict[str, int], what: str) -> None:
    got = sources(out)
    if got != want:
        raise SystemExit(f"{what}: expected {want}, got {got}")


def ninja_bin() -> str:
    from ctxbuild.engine.ninja import ninja_binary

    return ninja_binary()


def workload(b: Bench, tag: str, n: int, model: Callable[[int], onnx.ModelProto], reps: int, url: str,
             nginx_data: Path, changes: bool) -> None:
    """One workload's scenarios, interleaved repetition by repetition."""
    root = b.root / tag
    rec = write_tree(root, n, model)
    actions = 3 * n  # prepare + 2 compiles per recipe
    warm_cache, warm_out = root / "warm-cache", root / "warm-out"
    b.build(rec, warm_out, warm_cache)  # also warms the page cache and the toolchain memo
    expect(warm_out, {"run": actions}, "first build")
    victim = f"m{min(7, n - 1):02d}"
    changed = rec / "models" / f"{victim}.onnx"
    original = changed.read_bytes()
    single_src = rec / f"{victim}.yaml"
    for rep in range(reps):
        print(f"[{tag}] repetition {rep + 1}/{reps}", flush=True)
        # cold, local
        out = b.fresh(f"{tag}/cold-out")
        b.sample(f"{tag}.cold", b.build(rec, out, b.fresh(f"{tag}/cold-cache")))
        expect(out, {"run": actions}, "cold")
        # no-op, and ninja's own floor
        b.sample(f"{tag}.noop", b.build(rec, warm_out, warm_cache))
        expect(warm_out, {}, "noop")
        b.sample(f"{tag}.ninja_n", b.run([ninja_bin(), "-n"], cwd=warm_out))
        # restore into a fresh OUT vs cp -r of the same outputs
        out = b.fresh(f"{tag}/restore-out")
        b.sample(f"{tag}.restore", b.build(rec, out, warm_cache))
        expect(out, {"cache": actions}, "restore")
        dest = b.fresh(f"{tag}/cp")
        dest.mkdir()
        (dest / ".ctxbuild").mkdir()
        b.sample(f"{tag}.cp_r", b.run(["cp", "-r", *(str(warm_out / t) for t in TARGETS), str(dest)]) +
                 b.run(["cp", "-r", str(warm_out / ".ctxbuild" / "work"), str(dest / ".ctxbuild")]))
        if changes:
            # one model changed among N, vs that model's own actions alone
            onnx.save(model(50_000 + rep), changed)
            b.sample(f"{tag}.one_changed", b.build(rec, warm_out, warm_cache))
            expect(warm_out, {"run": 3}, "one changed")
            single = b.fresh(f"{tag}/single")
            (single / "models").mkdir(parents=True)
            shutil.copy(single_src, single / single_src.name)
            shutil.copy(changed, single / "models" / changed.name)
            b.sample(f"{tag}.own_actions", b.build(single, b.fresh(f"{tag}/single-out"), None))
            changed.write_bytes(original)
            b.build(rec, warm_out, warm_cache)  # back to the warm state (restored from the cache)
            expect(warm_out, {"cache": 3}, "revert")

        # --- through the remote cache; an empty local cache every time ---------------------------------
        for p in nginx_data.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        out = b.fresh(f"{tag}/rcold-out")
        b.sample(f"{tag}.cold_remote", b.build(rec, out, b.fresh(f"{tag}/rcold-cache"), remote=url))
        expect(out, {"run": actions}, "cold remote")
        remote_out = out
        out = b.fresh(f"{tag}/rrestore-out")
        b.sample(f"{tag}.restore_remote", b.build(rec, out, b.fresh(f"{tag}/rrestore-cache"), remote=url))
        expect(out, {"cache": actions}, "restore remote")
        b.sample(f"{tag}.noop_remote", b.build(rec, remote_out, b.fresh(f"{tag}/rnoop-cache"), remote=url))
        expect(remote_out, {}, "noop remote")
        if changes:
            onnx.save(model(60_000 + rep), changed)
            b.sample(f"{tag}.one_changed_remote",
                     b.build(rec, remote_out, b.fresh(f"{tag}/rchanged-cache"), remote=url))
            expect(remote_out, {"run": 3}, "one changed remote")
            changed.write_bytes(original)
            b.build(rec, warm_out, warm_cache)  # warm_out saw the original bytes last: stays a no-op
        for p in root.glob("*-*"):  # keep the disk use flat: drop this repetition's OUTs and caches
            if p.name not in ("warm-cache", "warm-out") and p.parent == root:
                shutil.rmtree(p, ignore_errors=True)


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: {"median": round(statistics.median(v), 4), "min": round(min(v), 4), "max": round(max(v), 4),
                "n": len(v)} for k, v in sorted(samples.items())}


def ratios(med: dict[str, float], tag: str) -> dict[str, float]:
    g = lambda k: med.get(f"{tag}.{k}")  # noqa: E731
    out = {}
    for name, num, den in (("noop/ninja_n", "noop", "ninja_n"), ("restore/cp_r", "restore", "cp_r"),
                           ("restore/cold", "restore", "cold"), ("one_changed/own_actions", "one_changed", "own_actions"),
                           ("restore_remote/cp_r", "restore_remote", "cp_r"),
                           ("restore_remote/cold_remote", "restore_remote", "cold_remote"),
                           ("one_changed_remote/own_actions", "one_changed_remote", "own_actions")):
        if g(num) is not None and g(den):
            out[name] = round(g(num) / g(den), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--big-models", type=int, default=0)
    ap.add_argument("--big-mb", type=int, default=40)
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ctxbuild-cache-bench-"))
    url, stop = start_nginx(root / "nginx")
    b = Bench(root)
    t0 = time.monotonic()
    try:
        workload(b, "tiny", args.models, mlp, args.reps, url, root / "nginx" / "data", changes=True)
        if args.big_models:
            workload(b, "big", args.big_models, lambda s: big_mlp(s, args.big_mb), args.reps, url,
                     root / "nginx" / "data", changes=False)
    finally:
        stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    stats = summarize(b.samples)
    med = {k: v["median"] for k, v in stats.items()}
    result = {"workload": {"models": args.models, "targets": TARGETS, "compile_targets": 2 * args.models,
                           "actions": 3 * args.models, "precision": "fp16", "verify": False,
                           "big_models": args.big_models, "big_mb": args.big_mb},
              "reps": args.reps, "seconds": stats,
              "ratios": {tag: ratios(med, tag) for tag in ("tiny", "big") if f"{tag}.noop" in med},
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
              "wall_seconds": round(time.monotonic() - t0, 1)}
    goals = {}
    for name, (ratio, _, limit, unit) in GOALS.items():
        value = med.get("tiny.noop") if unit == "s" else result["ratios"]["tiny"].get(ratio)
        goals[name] = {"value": value, "goal": f"<= {limit}{unit}", "met": value is not None and value <= limit}
    result["goals"] = goals
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "cache.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nmedians over {args.reps} repetitions ({args.models} recipes x {len(TARGETS)} SoCs):")
    for k, v in stats.items():
        print(f"  {k:<28} {v['median']:8.3f} s   (min {v['min']:.3f}, max {v['max']:.3f})")
    for tag, rs in result["ratios"].items():
        for k, v in rs.items():
            print(f"  {tag}.{k:<28} {v:6.2f}x")
    for name, g in goals.items():
        print(f"  goal {name:<12} {g['value']} {g['goal']}: {'met' if g['met'] else 'MISSED'}")
    print(f"wrote {HERE / 'results' / 'cache.json'}")


if __name__ == "__main__":
    main()
