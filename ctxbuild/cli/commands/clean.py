"""`ctxbuild clean`: remove what ctxbuild wrote into OUT, nothing else (engine/outdir.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ctxbuild.cli import options
from ctxbuild.cli.parser import Command


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", type=options.out_dir, default=Path("out"), help="output directory (default: out)")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.engine.outdir import clean

    if not clean(args.out) and not args.quiet:  # as a second `make clean`: done, nothing to say but that
        print(f"ctxbuild: nothing to clean in {args.out} (no ctxbuild output there)")
    return 0


COMMAND = Command("clean", "remove what ctxbuild wrote into OUT", arguments, run)
