"""An `llm:` recipe end to end: cold build, no-op, one context length added; bytes shared vs unshared; tokens.

A generated Llama-style decoder (recipes/models/llm_decoder.py; default hidden 256, 4 layers, vocab 2048),
2 parts x AR {32, 1} x CL {128, 256}, one SoC, built with the real CLI into a private cache. Reports per action
kind the seconds and peak RSS against the estimate (from the records), the parts' .bin bytes against the same
graphs compiled one by one (the part checks' twins: no sharing), the bytes on disk after the cold build (OUT and
the cache, by what holds them, against the model's), the no-op build time, which actions re-run when CL 512 is
added, and the verification: each part check's figures, its twin compile and simulator seconds, and the wall time
of all of them with the genai config's run. Writes bench/results/llm_bench.json.

    python bench/llm_bench.py [--hidden 256 --layers 4 --vocab 2048 --precision w8a16]
    # the ~1B shape (Llama-3.2-1B: hidden 2048, 16 layers, 32/8 heads, MLP 8192, vocab 128256):
    python bench/llm_bench.py --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --intermediate 8192 \
        --vocab 128256 --ar 128 1 --cl 1024 2048 --add-cl 0 --precision w4a16 --workdir /var/tmp
    # ... with block-wise int4 and the scale search, 4 parts (docs/llm-reference.md, the 1B shape)
    <the same> --parts 4 --memory-budget 18G --verify-timeout 1800 --quantization '{"scale_search": true}'
    # the 3B shape (Llama-3.2-3B): the plan's memory estimates only (weights as a sparse file: no disk, no RAM) ...
    python bench/llm_bench.py --hidden 3072 --layers 28 --heads 24 --kv-heads 8 --intermediate 8192 \
        --vocab 128256 --ar 128 1 --cl 1024 2048 --parts 4 --precision w4a16 --plan-only
    # ... and one part built (the split, that part's quantize and bundle; no verification, no cache)
    python bench/llm_bench.py <the same shape> --only-part 1 --samples 2 --workdir /tmp --memory-budget 22G

--plan-only and --only-part write bench/results/llm_bench_plan.json / llm_bench_part<N>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "recipes" / "models"))
import llm_decoder  # noqa: E402

BENCHMARK = "llm: recipe: cold build, no-op, CL added; shared vs unshared bytes; token agreement"
CTXBUILD = [sys.executable, "-m", "ctxbuild"]


def build(recipes: Path, out: Path, env: dict[str, str], budget: str | None = None) -> float:
    start = time.monotonic()
    p = subprocess.run([*CTXBUILD, "build", str(recipes), "-o", str(out), *(["--memory-budget", budget] if budget else [])],
                       capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(p.stdout + p.stderr)
    return time.monotonic() - start


def write_recipe(d: Path, args: argparse.Namespace, cls: list[int]) -> None:
    (d / "llm.yaml").write_text(json.dumps({
        "name": "llm", "targets": [args.target], "verify": {"timeout_s": args.verify_timeout},
        "llm": {"model": "llama.onnx", "sequence_lengths": args.ar, "context_lengths": cls, "parts": args.parts,
                "precision": args.precision, "prompts": {"dir": "prompts", "samples": args.samples,
                                                         "verify": args.verify}, "generate": 8,
                # the bench reports the token figures, it does not gate on them: a build that fails verification
                # is not cached, and the no-op and CL-added steps would re-verify (random weights fail w4a16)
                "min_token_agreement": 0, "min_cosine": -1, "min_kv_cosine": -1, "max_ppl_ratio": 1000,
                "min_agreement": 0, **({"quantization": json.loads(args.quantization)} if args.quantization else {})}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=BENCHMARK)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--heads", type=int, help="attention heads (default hidden / 32)")
    ap.add_argument("--kv-heads", type=int, help="key/value heads (default hidden / 128)")
    ap.add_argument("--intermediate", type=int, help="MLP width (default 3 x hidden)")
    ap.add_argument("--ar", type=int, nargs="+", default=[32, 1], help="sequence lengths")
    ap.add_argument("--cl", type=int, nargs="+", default=[128, 256], help="context lengths of the cold build")
    ap.add_argument("--add-cl", type=int, default=512,
                    help="the context length added after the cold build (0: skip that step)")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--precision", default="w8a16")
    ap.add_argument("--quantization", help='llm.quantization as JSON, e.g. \'{"scale_search": true}\'')
    ap.add_argument("--target", default="SM8650")
    ap.add_argument("--samples", type=int, default=4, help="calibration prompts")
    ap.add_argument("--verify", type=int, default=2, help="verification prompts")
    ap.add_argument("--prompt-tokens", type=int, help="tokens per prompt (default: the largest AR + 8)")
    ap.add_argument("--verify-timeout", type=float, default=600, help="seconds the simulator may take per CL")
    ap.add_argument("--memory-budget", help="passed to ctxbuild build (its estimates err high at LLM sizes)")
    ap.add_argument("--workdir", type=Path, help="keep the build here (default: a temporary directory)")
    ap.add_argument("--plan-only", action="store_true",
                    help="plan with zero weights in a sparse file and print every action's memory estimate")
    ap.add_argument("--only-part", type=int, metavar="N",
                    help="build only part N's deliverable (split, its quantize, its bundle) with ninja, no "
                         "verification, no cache: a model too large to build whole here")
    args = ap.parse_args()
    cfg = llm_decoder.Config(vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                             heads=args.heads or args.hidden // 32, kv_heads=args.kv_heads or max(1, args.hidden // 128),
                             intermediate=args.intermediate or 3 * args.hidden,
                             max_positions=max(args.cl + [args.add_cl]))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        if args.plan_only:
            result, name = plan_only(args, cfg, work), "llm_bench_plan"
        elif args.only_part:
            result, name = only_part(args, cfg, work), f"llm_bench_part{args.only_part}"
        else:
            result, name = run(args, cfg, work), "llm_bench"
    dst = ROOT / "bench" / "results"
    dst.mkdir(parents=True, exist_ok=True)
    (dst / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def make_model(args: argparse.Namespace, cfg: llm_decoder.Config, src: Path, zeros: bool = False) -> dict:
    """The decoder and its prompts in `src` (weights written as they are made, beside the graph as exporters write
    them; `zeros`: a sparse file); its parameter count and decoder facts."""
    import numpy as np
    import onnx

    from ctxbuild.llm.convention import weight_sizes

    src.mkdir()
    model = llm_decoder.decoder(cfg, data=src / "llama.onnx.data", zeros=zeros)
    onnx.save(model, src / "llama.onnx")
    onnx.checker.check_model(src / "llama.onnx")
    (src / "prompts").mkdir()
    for i, p in enumerate(llm_decoder.prompts(cfg, max(args.samples, args.verify), args.prompt_tokens or max(args.ar) + 8)):
        np.save(src / "prompts" / f"prompt_{i}.npy", p)
    return {"parameters": sum(int(np.prod(t.dims)) for t in model.graph.initializer),
            "facts": {"layers": cfg.layers, "weight_sizes": weight_sizes(model)}}


def by_kind(out: Path) -> dict[str, dict[str, float]]:
    """Per action kind: actions, seconds in all, the largest peak RSS and estimate (from the build's records)."""
    kinds: dict[str, dict[str, float]] = {}
    for p in (out / ".ctxbuild" / "records").glob("*.json"):
        r = json.loads(p.read_text())
        k = kinds.setdefault(r["kind"], {"actions": 0, "seconds": 0.0, "peak_rss_mb": 0.0, "estimate_mb": 0.0})
        k["actions"] += 1
        k["seconds"] = round(k["seconds"] + r.get("seconds", 0), 2)
        k["peak_rss_mb"] = max(k["peak_rss_mb"], round((r.get("peak_rss") or 0) / 2**20, 1))
        k["estimate_mb"] = max(k["estimate_mb"], round((r.get("memory_estimate") or 0) / 2**20, 1))
    return kinds


def plan_only(args: argparse.Namespace, cfg: llm_decoder.Config, work: Path) -> dict:
    """Every action's memory estimate before any ran (plan/memory.planned), and the parts' estimated weight bytes."""
    from ctxbuild.plan import memory
    from ctxbuild.plan.planner import make_plan
    from ctxbuild.recipes import recipe
    from ctxbuild.recipes.llm import part_weight_bytes

    src = work / "recipes"
    model = make_model(args, cfg, src, zeros=True)
    write_recipe(src, args, args.cl)
    plan = make_plan(recipe.load([src]), work / "out")
    estimates = memory.planned(plan.actions)
    return {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "parameters": model["parameters"],
            "part_weight_bytes": [int(b) for b in part_weight_bytes(model["facts"], args.parts, args.precision, None)],
            "estimates_gib": {a.id: round(estimates[a.id] / 2**30, 2) for a in plan.actions}}


def only_part(args: argparse.Namespace, cfg: llm_decoder.Config, work: Path) -> dict:
    """Part N's deliverable built by ninja from a plan without verification, no cache: seconds, peak RSS and
    estimate per action, the part's .bin bytes against its estimated weight bytes, the bytes on disk."""
    from ctxbuild.engine import ninja, replan
    from ctxbuild.recipes.llm import part_weight_bytes

    src, out = work / "recipes", work / "out"
    model = make_model(args, cfg, src)
    write_recipe(src, args, args.cl)
    env = {**os.environ, "CTXBUILD_NO_CACHE": "1",
           **({"CTXBUILD_MEMORY_BUDGET": args.memory_budget} if args.memory_budget else {})}
    replan.plan_and_render(out, {"paths": [str(src.resolve())], "compile_jobs": 1, "verify": False})
    state = ninja.read_state(out, "plan.json")
    bundle = next(a for a in state["actions"] if a["id"].startswith(f"bundle/llm.part{args.only_part}@"))
    start = time.monotonic()
    target = next(o for o in bundle["outputs"] if o.endswith("_qnn.bin"))
    p = subprocess.run([ninja.ninja_binary(), "-j", "1", os.path.relpath(target, out)], cwd=out, env=env,
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stdout[-5000:] + p.stderr[-5000:])
    weights = part_weight_bytes(model["facts"], args.parts, args.precision, None)[args.only_part - 1]
    binary = Path(target).stat().st_size
    return {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "parameters": model["parameters"], "seconds": round(time.monotonic() - start, 1),
            "actions": {r["id"]: {"seconds": r.get("seconds"), "peak_rss_mb": round((r.get("peak_rss") or 0) / 2**20),
                                  "estimate_mb": round((r.get("memory_estimate") or 0) / 2**20)}
                        for r in map(lambda f: json.loads(f.read_text()), (out / ".ctxbuild" / "records").glob("*.json"))},
            "bin_bytes": binary, "weight_bytes_estimate": int(weights), "bin_over_weights": round(binary / weights, 3),
            "disk_after": disk_bytes(src / "llama.onnx", out, work / "cache")}


def run(args: argparse.Namespace, cfg: llm_decoder.Config, work: Path) -> dict:
    from ctxbuild.recipes.llm import part_weight_bytes

    src, out = work / "recipes", work / "out"
    model = make_model(args, cfg, src)
    params, facts = model["parameters"], model["facts"]
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(work / "cache")}
    write_recipe(src, args, args.cl)
    cold = build(src, out, env, args.memory_budget)
    kinds = by_kind(out)
    recs = [json.loads(f.read_text()) for f in (out / ".ctxbuild" / "records").glob("*.json")]
    bins = out / args.target / "llm"
    shared = sum(p.stat().st_size for p in bins.glob("*_qnn.bin"))
    unshared = sum(r.get("twin_bin_bytes", 0) for r in recs)  # the part checks compile each graph alone, not kept
    weights = sum(part_weight_bytes(facts, args.parts, args.precision, None))
    verify = {p.stem: json.loads(p.read_text())["by_cl"] for p in sorted((bins / "llm_verify").glob("*.json"))}
    disk = disk_bytes(src / "llama.onnx", out, work / "cache")
    noop = sorted(build(src, out, env, args.memory_budget) for _ in range(3))[1]
    added, ran = None, {}
    if args.add_cl:
        write_recipe(src, args, args.cl + [args.add_cl])
        added = build(src, out, env, args.memory_budget)
        ran = json.loads((out / ".ctxbuild" / "last_build.json").read_text())["actions"]
    return {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "parameters": params, "weights_fp32_mb": round(params * 4 / 2**20, 1),
            "cold_s": round(cold, 1), "noop_s_median_of_3": round(noop, 2), "cl_added_s": added and round(added, 1),
            "cl_added_ran": sorted(a for a, what in ran.items() if what == "run"),
            "bin_bytes_shared": shared, "bin_bytes_unshared": unshared,
            "shared_over_unshared": round(shared / unshared, 3),
            "weight_bytes_estimate": int(weights), "shared_over_weights": round(shared / weights, 3),
            "disk_after_cold": disk, "by_kind": kinds, "verification": verification_times(recs), "verify": verify}


def verification_times(recs: list[dict]) -> dict:
    """The token verification: the per-part checks (side by side) and the genai config's run, from their records:
    wall seconds from the first start to the last end, and each check's compile and simulator seconds."""
    checks = [r for r in recs if r["kind"] in ("llm_part_eval", "llm_genai")]
    if not checks:
        return {}
    return {"wall_s": round(max(r["finished"] for r in checks) - min(r["started"] for r in checks), 1),
            "checks": {r["id"]: {k: r.get(k) for k in ("seconds", "twin_compile_seconds", "simulator_seconds",
                                                      "simulator_seconds_by_graph",
                                                      "peak_rss", "memory_estimate")} for r in checks}}


def disk_bytes(model: Path, out: Path, cache: Path) -> dict[str, int | float]:
    """Bytes on disk (st_blocks, a file linked twice counted once) of OUT by what holds them and of the cache,
    and (OUT + cache) / the model's bytes (.onnx + external data)."""
    from ctxbuild.graph.modelio import weight_bytes

    seen: set[tuple[int, int]] = set()

    def du(root: Path, pattern: str = "*") -> int:
        total = 0
        for p in root.rglob(pattern):
            st = p.lstat()
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
        return total

    work = out / ".ctxbuild" / "work" / "llm"
    parts = {"twins": du(work / "twins"), "qdq": du(work, "*-q[0-9]*-*/*"), "static_float": du(work),
             "rest_of_out": du(out), "cache": du(cache)}  # each file counted under the first that holds it
    model_bytes = weight_bytes(model)
    return {"model": model_bytes, **parts, "out_and_cache_over_model": round(sum(parts.values()) / model_bytes, 2),
            "out_files": out_files(out, cache)}


def out_files(out: Path, cache: Path) -> dict[str, int]:
    """OUT's files: how many, and how many of their bytes are in files of LINK_LARGE_BYTES or more (what the
    local cache links by default) and in files that share their inode with a cache blob."""
    from ctxbuild.cache.files import LINK_LARGE_BYTES

    blobs = {(st.st_dev, st.st_ino) for p in cache.rglob("*") if stat.S_ISREG((st := p.lstat()).st_mode)}
    files = [st for p in out.rglob("*") if stat.S_ISREG((st := p.lstat()).st_mode)]
    large = [st for st in files if st.st_size >= LINK_LARGE_BYTES]
    return {"files": len(files), "bytes": sum(st.st_size for st in files),
            "large_files": len(large), "large_bytes": sum(st.st_size for st in large),
            "bytes_linked_to_cache": sum(st.st_size for st in files if (st.st_dev, st.st_ino) in blobs)}


if __name__ == "__main__":
    main()
