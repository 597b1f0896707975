"""`ctxbuild completion bash|zsh|tcsh`: a completion script, generated from the whole parser by shtab."""
from __future__ import annotations

import argparse
import sys

from ctxbuild.cli.parser import Command

EXAMPLES = """examples:
  ctxbuild completion bash > ~/.local/share/bash-completion/completions/ctxbuild
  ctxbuild completion zsh > ~/.zfunc/_ctxbuild"""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=["bash", "zsh", "tcsh"], help="the shell")


def run(args: argparse.Namespace) -> int:
    import shtab

    sys.stdout.write(shtab.complete(args.parser, shell=args.shell))
    return 0


COMMAND = Command("completion", "print a shell completion script (bash, zsh, tcsh)", arguments, run, EXAMPLES)
