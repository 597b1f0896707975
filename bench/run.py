"""Run every benchmark in bench/, one process each, in name order: `make bench` (or `python bench/run.py`).

A benchmark is a bench/*.py file with a top-level `BENCHMARK = "<what it measures>"` and a `main()`
(it parses its own arguments; run with none, it uses its defaults). Adding one is adding such a file:
nothing here lists them. Files are found by reading their source, not importing it (helpers such as
models.py, and the baselines benchmarks call, carry no BENCHMARK and are not run).

Usage: python bench/run.py [--list] [--args "ARGS"] [NAME...]   (NAME: a file stem, e.g. cache_bench;
ARGS: passed to each benchmark run, e.g. --args "--reps 1")
"""
from __future__ import annotations

import argparse
import ast
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover(directory: Path = HERE) -> dict[str, str]:
    """stem -> description, for every benchmark file in `directory`."""
    found = {}
    for path in sorted(directory.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        described = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "BENCHMARK" for t in n.targets)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
        has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        if described and has_main:
            found[path.stem] = described[0]
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help="only these benchmarks (default: all)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    ap.add_argument("--args", default="", help="arguments for each benchmark (one shell-quoted string)")
    args = ap.parse_args()
    benchmarks = discover()
    if args.list:
        for name, what in benchmarks.items():
            print(f"{name:<20} {what}")
        return 0
    unknown = sorted(set(args.names) - set(benchmarks))
    if unknown:
        print(f"bench/run.py: no benchmark named {', '.join(unknown)}; have: {', '.join(benchmarks)}", file=sys.stderr)
        return 2
    failed = []
    for name in args.names or list(benchmarks):
        print(f"=== {name}: {benchmarks[name]}", flush=True)
        t = time.monotonic()
        code = subprocess.call([sys.executable, str(HERE / f"{name}.py"), *shlex.split(args.args)])
        print(f"=== {name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {time.monotonic() - t:.0f} s",
              flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
