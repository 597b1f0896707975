"""`ctxbuild verify`: only the verification edges of a build (cached results reused); `--layers RECIPE`
diagnoses one recipe per layer (cli/layers.py)."""
from __future__ import annotations

import argparse

from ctxbuild.cli import options
from ctxbuild.cli.parser import Command

EXAMPLES = """examples:
  ctxbuild verify                        re-verify what was built (cached results reused)
  ctxbuild verify --layers detector      which layers lose the accuracy, and the likely fix"""


def arguments(p: argparse.ArgumentParser) -> None:
    options.paths_out(p)
    options.jobs(p)
    p.add_argument("--layers", metavar="RECIPE", help="diagnose RECIPE per layer: quantization vs HTP loss "
                   "(default: no diagnosis, verify every recipe)")
    p.add_argument("--target", action="append", default=[], metavar="NAME", help="with --layers: only this target (repeatable; default: every target)")
    p.add_argument("--samples", type=options.count(1), metavar="N", help="with --layers: samples to run (default: verify's)")
    p.add_argument("--json", action="store_true", help="print one JSON document with the results on stdout")
    options.cache_args(p)
    options.executor_args(p)


def run(args: argparse.Namespace) -> int:
    if args.layers:
        from ctxbuild.cli.layers import main as layers

        return layers(args.paths, args.out, args.layers, args.target, samples=args.samples,
                      cache_env=options.cache_env(args), as_json=args.json, recipe_args=options.recipe_args(args))
    from ctxbuild.engine.build import build
    from ctxbuild.engine.options import BuildOptions

    return build(BuildOptions(paths=args.paths, out=args.out, jobs=args.jobs, verify_only=True,
                              cache_env=options.cache_env(args), executor=args.executor,
                              executor_fallback=args.executor_fallback, console=options.console(args),
                              recipe_args=options.recipe_args(args)))


COMMAND = Command("verify", "run only the verification of built artifacts (cached results reused)", arguments, run,
                  EXAMPLES)
