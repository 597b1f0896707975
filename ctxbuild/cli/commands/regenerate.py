"""`ctxbuild regenerate OUT` (internal): ninja's generator edge, re-plan OUT/build.ninja."""
from __future__ import annotations

import argparse
from pathlib import Path

from ctxbuild.cli.parser import Command


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="the output directory")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.engine.fast.replan import regenerate

    regenerate(args.out)
    return 0


COMMAND = Command("regenerate", None, arguments, run,
                  description="internal: re-plan OUT/build.ninja (ninja's generator edge)")
