"""`ctxbuild build`: plan the recipes, run ninja, write the manifest and the report (engine/build.py)."""
from __future__ import annotations

import argparse

from ctxbuild.cli import options
from ctxbuild.cli.parser import Command

EXAMPLES = """examples:
  ctxbuild build                                   every recipe in recipes/ into out/
  ctxbuild build recipes/detector.yaml -o out      one recipe
  ctxbuild build --only detector --target SM8750   one recipe, one SoC
  ctxbuild build -n                                what would run (a dry run; also under `make -n`)
  ctxbuild build --json | jq .accuracy             results as JSON
  ctxbuild build --remote-cache http://cache:8080  share a cache between machines"""


def arguments(p: argparse.ArgumentParser) -> None:
    options.paths_out(p)
    options.jobs(p)
    # 0 by default: a multi-SoC build gives every SoC's verdict (what a failure stops is only what depends on it)
    p.add_argument("-k", "--keep-going", type=options.count(0), default=0, metavar="N",
                   help="stop after N failed actions (0: never; what depends on a failure is not run either; "
                        "default: %(default)s, every SoC's verdict)")
    p.add_argument("--target", action="append", default=[], metavar="NAME", help="only this target (repeatable; default: every target the recipes name)")
    p.add_argument("--only", action="append", default=[], metavar="RECIPE", help="only this recipe (repeatable; default: every recipe)")
    p.add_argument("--dry-run", "-n", action="store_true", help="show what would run")
    p.add_argument("--compile-jobs", type=options.count(1), help="max concurrent compiles "
                   "(default: min(CPUs, RAM / 4 GiB), at least 1)")
    p.add_argument("--memory-budget", metavar="SIZE", help="memory concurrent actions may use, e.g. 16G "
                   "(default: what is available when the build starts, less 256 MB)")
    p.add_argument("--explain", action="store_true", help="say why each action ran or was restored")
    p.add_argument("--no-verify", action="store_true", help="skip simulator verification of the artifacts")
    p.add_argument("--json", action="store_true", help="print one JSON document with the results on stdout "
                   "(progress goes to stderr)")
    options.cache_args(p)
    options.executor_args(p)


def run(args: argparse.Namespace) -> int:
    from ctxbuild.engine.build import build
    from ctxbuild.engine.options import BuildOptions

    return build(BuildOptions(paths=args.paths, out=args.out, jobs=args.jobs, keep_going=args.keep_going,
                              targets=args.target, only=args.only, dry_run=args.dry_run,
                              compile_jobs=args.compile_jobs, explain=args.explain, verify=not args.no_verify,
                              cache_env=options.cache_env(args),
                              memory_budget=options.size(args.memory_budget, "--memory-budget"),
                              executor=args.executor, executor_fallback=args.executor_fallback,
                              console=options.console(args),
                              recipe_args=options.recipe_args(args)))


COMMAND = Command("build", "build recipes (default: recipes/) into OUT", arguments, run, EXAMPLES)
