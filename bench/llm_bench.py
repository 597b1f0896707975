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
                "min_token_agreement": 0, "min_cosine": -1}}))


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
    ap.add_argument("--target", default="SM8650")
    ap.add_argument("--samples", type=int, default=4, help="calibration prompts")
    ap.add_argument("--verify", type=int, default=2, help="verification prompts")
    ap.add_argument("--verify-timeout", type=float, default=600, help="seconds the simulator may take per CL")
    ap.add_argument("--memory-budget", help="passed to ctxbuild build (its estimates err high at LLM sizes)")
    ap.add_argument("--workdir", type=Path, help="keep the build here (default: a temporary directory)")
    args = ap.parse_args()
    cfg = llm_decoder.Config(vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                             heads=args.heads or args.hidden // 32, kv_heads=args.kv_heads or max(1, args.hidden // 128),
                             intermediate=args.intermediate or 3 * args.hidden,
                             max_positions=max(args.cl + [args.add_cl]))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        result = run(args, cfg, Path(tmp))
    dst = ROOT / "bench" / "results"
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "llm_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def run(args: argparse.Namespace, cfg: llm_decoder.Config, work: Path) -> dict:
    import numpy as np
    import onnx

    from ctxbuild.llm.convention import weight_sizes
    from ctxbuild.recipes.llm import part_weight_bytes

    src, out = work / "recipes", work / "out"
    src.mkdir()
    model = llm_decoder.decoder(cfg)
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    facts = {"layers": cfg.layers, "weight_sizes": weight_sizes(model)}
    # over 2 GB of float32 the protobuf limit applies: weights beside the graph, as exporters write them
    onnx.save(model, src / "llama.onnx", save_as_external_data=True, location="llama.onnx.data")
    del model
    onnx.checker.check_model(src / "llama.onnx")
    (src / "prompts").mkdir()
    for i, p in enumerate(llm_decoder.prompts(cfg, max(args.samples, args.verify), max(args.ar) + 8)):
        np.save(src / "prompts" / f"prompt_{i}.npy", p)
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(work / "cache")}
    write_recipe(src, args, args.cl)
    cold = build(src, out, env, args.memory_budget)
    recs = [json.loads(p.read_text()) for p in (out / ".ctxbuild" / "records").glob("*.json")]
    kinds: dict[str, dict[str, float]] = {}
    for r in recs:
        k = kinds.setdefault(r["kind"], {"actions": 0, "seconds": 0.0, "peak_rss_mb": 0.0, "estimate_mb": 0.0})
        k["actions"] += 1
        k["seconds"] = round(k["seconds"] + r.get("seconds", 0), 2)
        k["peak_rss_mb"] = max(k["peak_rss_mb"], round((r.get("peak_rss") or 0) / 2**20, 1))
        k["estimate_mb"] = max(k["estimate_mb"], round((r.get("memory_estimate") or 0) / 2**20, 1))
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
    return {"model": model_bytes, **parts, "out_and_cache_over_model": round(sum(parts.values()) / model_bytes, 2)}


if __name__ == "__main__":
    main()
