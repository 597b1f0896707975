"""`ctxbuild action SPEC` (internal): run one action in this process, what a ninja edge's client falls back to
without a worker (engine/run/client.py)."""
from __future__ import annotations

import argparse

from ctxbuild.cli.parser import Command


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="the action's spec file (OUT/.ctxbuild/actions/<id>.json)")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.engine.run.client import main as run_client

    return run_client([args.spec])


COMMAND = Command("action", None, arguments, run, description="internal: run one action (what a ninja edge runs)",
                  ctrl_c=False)
