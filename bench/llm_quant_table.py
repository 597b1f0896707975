"""The weight-quantization techniques of `llm.quantization` on one decoder: one cold build per setting (the real CLI,
one SoC, a private cache whose float split is shared), and per setting the part checks' figures and the quantize
actions' seconds. Prints a Markdown table (docs/llm.md, Weight quantization) and writes
bench/results/llm_quant_table.json.

    python bench/llm_quant_table.py MODEL.onnx PROMPTS_DIR [--ar 16 1 --cl 64 --parts 2 --soc SM8650 --verify 6
                                    --block-size 32 --only 0 3]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def settings(block: int) -> dict[str, dict[str, object]]:
    """Setting name -> llm fields (precision, keep_8bit, quantization)."""
    b = {"int4": "block", "block_size": block}
    return {
        "w8a16 onnxruntime (one scale per matrix)": {"precision": "w8a16", "quantization": {"int8": "tensor"}},
        "w8a16 per channel (default)": {"precision": "w8a16"},
        f"w4a16 block {block}, first/last blocks int8 (default)": {"precision": "w4a16"},
        "w4a16 per channel": {"precision": "w4a16", "keep_8bit": [], "quantization": {"int4": "channel"}},
        "w4a16 per channel + scale search": {"precision": "w4a16", "keep_8bit": [],
                                             "quantization": {"int4": "channel", "scale_search": True}},
        f"w4a16 block {block}": {"precision": "w4a16", "keep_8bit": [], "quantization": b},
        f"w4a16 block {block} + scale search": {"precision": "w4a16", "keep_8bit": [],
                                                "quantization": {**b, "scale_search": True}},
        f"w4a16 block {block} + scale search, ranking keeps 10% int8": {
            "precision": "w4a16", "quantization": {**b, "scale_search": True, "keep_8bit_share": 0.1}},
    }


def figures(out: Path, parts: int) -> dict[str, object]:
    """Simulator figures of the part checks: the last part's logits (cosine, top-1) and the worst hidden state and
    KV output of any part, over every graph."""
    res: dict[str, object] = {}
    worst_kv, worst_hidden = 1.0, 1.0
    for p in range(1, parts + 1):
        d = json.loads((out / f"part{p}_of_{parts}.json").read_text())
        for cl in d["by_cl"].values():
            for graph, g in cl.get("simulator", {}).items():
                for name, o in g["outputs"].items():
                    if name.startswith("present."):
                        worst_kv = min(worst_kv, o["cosine"])
                    elif name == "logits":
                        kind = "prompt" if graph.startswith("prompt") else "token"
                        res[f"logits_{kind}"] = (o["cosine"], o["snr_db"], o["argmax_agreement"])
                    else:
                        worst_hidden = min(worst_hidden, o["cosine"])
        res["passed"] = res.get("passed", True) and d["passed"]
    res["kv_min"], res["hidden_min"] = worst_kv, worst_hidden
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("prompts", type=Path)
    ap.add_argument("--ar", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--cl", type=int, nargs="+", default=[64])
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--soc", default="SM8650")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--verify", type=int, default=6)
    ap.add_argument("--generate", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--only", nargs="*", help="settings to run, by number (0 = the first of settings())")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llm-quant-"))
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(work / "cache"), "PYTHONPATH": str(ROOT)}
    rows = []
    for i, (name, fields) in enumerate(settings(args.block_size).items()):
        if args.only and str(i) not in args.only:
            continue
        spec = {"model": str(args.model.resolve()), "sequence_lengths": args.ar, "context_lengths": args.cl,
                "parts": args.parts, "prompts": {"dir": str(args.prompts.resolve()), "samples": args.samples,
                                                 "verify": args.verify}, "generate": args.generate,
                "min_cosine": -1, "min_token_agreement": 0, **fields}  # report, do not gate
        r = work / re.sub(r"\W+", "_", name)
        r.mkdir()
        (r / "m.yaml").write_text(json.dumps({"name": "m", "llm": spec, "targets": [args.soc]}))
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(r), "-o", str(r / "out")], env=env,
                              capture_output=True, text=True)
        row: dict[str, object] = {"setting": name, "exit": done.returncode, "seconds": round(time.monotonic() - start, 1)}
        logs = sorted((r / "out" / ".ctxbuild" / "logs").glob("llm_quantize.*.log"))
        row["int4_seconds"] = sum(float(s) for f in logs for s in re.findall(r"activation rows in ([\d.]+) s", f.read_text()))
        row["quantize_lines"] = [line for f in logs for line in f.read_text().splitlines()
                                 if line.startswith(("calibration:", "weights:"))]
        if done.returncode == 0:
            row.update(figures(r / "out" / args.soc / "m" / "llm_verify", args.parts))
        else:
            row["error"] = done.stderr[-2000:]
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| setting | logits cos / SNR / top-1 (prompt) | logits cos / SNR / top-1 (token) | worst hidden | worst KV |"
          " weight choice s |\n|---|---|---|---|---|---|")
    for r in rows:
        if r["exit"] != 0:
            print(f"| {r['setting']} | failed (exit {r['exit']}) | | | | |")
            continue
        p, t = r["logits_prompt"], r["logits_token"]
        print(f"| {r['setting']} | {p[0]:.5f} / {p[1]:.1f} dB / {p[2]:.2f} | {t[0]:.5f} / {t[1]:.1f} dB / {t[2]:.2f} | "
              f"{r['hidden_min']:.4f} | {r['kv_min']:.4f} | {r['int4_seconds']:.1f} |")
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "llm_quant_table.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
