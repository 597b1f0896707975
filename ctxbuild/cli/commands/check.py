"""`ctxbuild check OUT --runtime ...`: the deploy gate, will OUT's wrappers load on a device runtime
(outputs/gate.py). Exit 1 if one will not."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ctxbuild.cli.parser import Command


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, help="a build's output directory (its manifest.json), one _ctx.onnx, or one "
                                           ".lora_config (checked against the binary beside it)")
    p.add_argument("--runtime", action="append", metavar="KEY=VERSION[,...]",
                   help="the devices' runtime: qairt=2.47 or onnxruntime-qnn=2.3.0, optionally ,onnxruntime=1.24.4 "
                        "(default: 1.24, the oldest the QNN EP runs on); repeatable")
    p.add_argument("--soc", metavar="NAME", help="the devices' SoC (default: the SoCs each artifact was built for)")
    p.add_argument("--no-ep", action="store_true",
                   help="do not ask the EP's own verdict (by default it is asked in each runtime's toolchain when "
                        "that toolchain is here: a child process per runtime, a few seconds)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.errors import SectionConfigError, UsageError
    from ctxbuild.outputs.gate import FAILING, check, table
    from ctxbuild.outputs.sections import config_problems, manifest_problems, read_manifest
    from ctxbuild.toolchain.runtimes import parse_cli

    # qnn.lora_config files first: one naming a graph the binary lacks, or another binary's section, is refused
    problems = (config_problems(args.path) if args.path.suffix == ".lora_config" and args.path.is_file() else
                manifest_problems(args.path, read_manifest(args.path)) if args.path.is_dir() else [])
    if problems:
        raise SectionConfigError("; ".join(problems), "a qnn.lora_config line is `<graph name in the binary>;<section>` "
                                 "(`ctxbuild inspect` lists the binary's graphs); rebuild OUT to rewrite them")
    if args.path.suffix == ".lora_config":
        print(f"{args.path}: every line names a graph of the binary beside it and an existing section")
        return 0
    if not args.runtime:
        raise UsageError("check: --runtime is required (except for a .lora_config)", "e.g. --runtime qairt=2.47")
    runtimes = [parse_cli(r) for r in args.runtime]
    rows = check(args.path, runtimes, args.soc)
    if not args.no_ep:
        from ctxbuild.outputs.epverdict import add_ep_verdicts

        add_ep_verdicts(rows, runtimes)
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 1 if any(r["verdict"] in FAILING for r in rows) else 0


COMMAND = Command("check", "deploy gate: will OUT's wrappers load on a device runtime (and SoC)?", arguments, run)
