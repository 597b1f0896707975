"""An `llm:` recipe end to end: cold build, no-op, one context length added; bytes shared vs unshared; tokens.

A generated Llama-style decoder (recipes/models/llm_decoder.py; default hidden 256, 4 layers, vocab 2048),
2 parts x AR {32, 1} x CL {128, 256}, one SoC, built with the real CLI into a private cache. Reports per action
kind the seconds and peak RSS against the estimate (from the records), the parts' .bin bytes against the same
graphs compiled one by one (the verification twins: no sharing), the no-op build time, which actions re-run
when CL 512 is added, and the token-level verification. Writes bench/results/llm_bench.json.

    python bench/llm_bench.py [--hidden 256 --layers 4 --vocab 2048 --precision w8a16]
"""
from __future__ import annotations

import argparse
import json
import os
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


def build(recipes: Path, out: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    p = subprocess.run([*CTXBUILD, "build", str(recipes), "-o", str(out)], capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(p.stdout + p.stderr)
    return time.monotonic() - start


def write_recipe(d: Path, cls: list[int], precision: str) -> None:
    (d / "llm.yaml").write_text(json.dumps({
        "name": "llm", "targets": ["SM8650"],
        "llm": {"model": "llama.onnx", "sequence_lengths": [32, 1], "context_lengths": cls, "parts": 2,
                "precision": precision, "prompts": {"dir": "prompts", "samples": 4, "verify": 2}, "generate": 8}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=BENCHMARK)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--precision", default="w8a16")
    args = ap.parse_args()
    cfg = llm_decoder.Config(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.hidden // 32,
                             kv_heads=max(1, args.hidden // 128), intermediate=3 * args.hidden, max_positions=1024)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src, out = work / "recipes", work / "out"
        src.mkdir()
        import onnx
        import numpy as np

        onnx.save(llm_decoder.decoder(cfg), src / "llama.onnx")
        (src / "prompts").mkdir()
        for i, p in enumerate(llm_decoder.prompts(cfg, 4, 40)):
            np.save(src / "prompts" / f"prompt_{i}.npy", p)
        env = {**os.environ, "CTXBUILD_CACHE_DIR": str(work / "cache")}
        write_recipe(src, [128, 256], args.precision)
        cold = build(src, out, env)
        recs = [json.loads(p.read_text()) for p in (out / ".ctxbuild" / "records").glob("*.json")]
        kinds: dict[str, dict[str, float]] = {}
        for r in recs:
            k = kinds.setdefault(r["kind"], {"actions": 0, "seconds": 0.0, "peak_rss_mb": 0.0, "estimate_mb": 0.0})
            k["actions"] += 1
            k["seconds"] = round(k["seconds"] + r.get("seconds", 0), 2)
            k["peak_rss_mb"] = max(k["peak_rss_mb"], round((r.get("peak_rss") or 0) / 2**20, 1))
            k["estimate_mb"] = max(k["estimate_mb"], round((r.get("memory_estimate") or 0) / 2**20, 1))
        shared = sum(p.stat().st_size for p in (out / "SM8650" / "llm").glob("*_qnn.bin"))
        unshared = sum(p.stat().st_size for p in (out / ".ctxbuild" / "work" / "llm" / "twins").rglob("*_qnn.bin"))
        verify = json.loads((out / "SM8650" / "llm" / "llm_verify.json").read_text())["by_cl"]
        noop = min(build(src, out, env) for _ in range(3))
        write_recipe(src, [128, 256, 512], args.precision)
        added = build(src, out, env)
        ran = json.loads((out / ".ctxbuild" / "last_build.json").read_text())["actions"]
        result = {"config": vars(args), "weights_mb": round(sum(t.ByteSize() for t in onnx.load(src / "llama.onnx").graph.initializer) / 2**20, 1),
                  "cold_s": round(cold, 1), "noop_s": round(noop, 2), "cl_added_s": round(added, 1),
                  "cl_added_ran": sorted(a for a, what in ran.items() if what == "run"),
                  "bin_bytes_shared": shared, "bin_bytes_unshared": unshared,
                  "shared_over_unshared": round(shared / unshared, 3), "by_kind": kinds, "verify": verify}
    dst = ROOT / "bench" / "results"
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "llm_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
