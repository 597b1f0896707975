"""`ctxbuild schema`: the recipe JSON Schema (for editors: yaml-language-server)."""
from __future__ import annotations

import argparse
import sys

from ctxbuild.cli.parser import Command


def arguments(p: argparse.ArgumentParser) -> None:
    """No arguments."""


def run(args: argparse.Namespace) -> int:
    from ctxbuild.recipes.recipe import SCHEMA_PATH

    sys.stdout.write(SCHEMA_PATH.read_text())
    return 0


COMMAND = Command("schema", "print the recipe JSON Schema", arguments, run)
