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
    print(json.dumps(info, indent=2) if args.json else format_text(info))
    return 0


COMMAND = Command("inspect", "describe a context binary (.bin) or EPContext model (_ctx.onnx)", arguments, run, EXAMPLES)
