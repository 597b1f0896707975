"""`ctxbuild wrap FILE.bin`: an EPContext wrapper per graph of a context binary made elsewhere (qnn/wrap.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ctxbuild.cli.parser import Command

EXAMPLES = """examples:
  ctxbuild wrap vendor_model.bin -o wrappers/   one EPContext model per graph of the binary"""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="the context binary (.bin) to wrap")
    p.add_argument("-o", "--out", type=Path, default=Path("."), help="directory for the wrappers (default: .)")
    p.add_argument("--embed", action="store_true", help="embed the binary in each wrapper")
    p.add_argument("--quantized-io", action="store_true", help="expose the graph's integer I/O (no Q/DQ)")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.qnn.wrap import wrap_binary

    for p in wrap_binary(args.file, args.out, embed=args.embed, quantized_io=args.quantized_io):
        print(p)
    return 0


COMMAND = Command("wrap", "write EPContext wrappers for every graph of a context binary", arguments, run, EXAMPLES)
