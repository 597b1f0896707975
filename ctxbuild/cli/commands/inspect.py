"""`ctxbuild inspect FILE`: describe a context binary, or the one an EPContext model names (qnn/contextbin.py)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ctxbuild.cli.parser import Command

EXAMPLES = """examples:
  ctxbuild inspect out/SM8750/detector/detector_ctx.onnx
  ctxbuild inspect --json vendor_model.bin"""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="a context binary, or an EPContext model (followed to its binary)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.qnn.contextbin import describe, format_text

    info = describe(args.file)
    alpha = _alpha_map(info)
    if args.json:
        print(json.dumps({**info, **({"lora_alpha": alpha} if alpha else {})}, indent=2))
    else:
        print(format_text(info) + ("\n" + "\n".join(alpha_text(alpha)) if alpha else ""))
    return 0


def _alpha_map(info: dict) -> dict | None:
    """An alpha-switched wrapper's map (adapters: {switch: alpha}), as the manifest lists it."""
    from ctxbuild.lora.alpha import KEY
    from ctxbuild.outputs.adapters import alpha_summary

    raw = ((info.get("wrapper") or {}).get("metadata") or {}).get(KEY)
    return alpha_summary(json.loads(raw)) if raw else None


def alpha_text(alpha: dict) -> list[str]:
    codes = alpha.get("codes") or {}
    feed = ("float 0.0 (off) .. 1.0 (on)" if codes.get("dtype") == "float32" else
            f"{codes.get('dtype')} codes: off {codes.get('off')}, on {codes.get('on')} (scale {codes.get('scale'):.6g}, "
            f"zero point {codes.get('zero_point')})")
    lines = [f"  LoRA alpha switch: input {alpha['input']}[{len(alpha['adapters'])}], {feed}",
             "    index  adapter  rank  scale  targets"]
    rows = [[str(a["index"]), a["name"], str(a["rank"]), f"{a['scale']:g}", ", ".join(a["targets"])] for a in alpha["adapters"]]
    widths = [max(len(r[i]) for r in rows + [["index", "adapter", "rank", "scale", "targets"]]) for i in range(5)]
    lines[1] = "    " + "  ".join(h.ljust(w) for h, w in zip(["index", "adapter", "rank", "scale", "targets"], widths)).rstrip()
    lines += ["    " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines


COMMAND = Command("inspect", "describe a context binary (.bin) or EPContext model (_ctx.onnx)", arguments, run, EXAMPLES)
