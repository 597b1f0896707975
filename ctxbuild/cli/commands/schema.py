"""`ctxbuild schema`: the recipe JSON Schema (for editors: yaml-language-server)."""
from __future__ import annotations

import argparse
import sys

from ctxbuild.cli.parser import Command


def arguments(p: argparse.ArgumentParser) -> None:
    """No arguments."""


def run(args: argparse.Namespace) -> int:
    import json

    from ctxbuild.recipes.recipe import schema

    sys.stdout.write(json.dumps(schema(), indent=2) + "\n")
    return 0


COMMAND = Command("schema", "print the recipe JSON Schema", arguments, run)
