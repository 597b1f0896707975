"""`ctxbuild targets`: the SoC table (recipes/targets.py), its aliases and device names."""
from __future__ import annotations

import argparse
import json

from ctxbuild.cli.parser import Command


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.recipes.targets import SOCS

    if args.json:
        print(json.dumps([{"name": s.name, "soc_model": s.soc_model, "htp_arch": s.htp_arch, "vtcm_mb": s.vtcm_mb,
                           "aliases": list(s.aliases), "marketing_name": s.marketing, "devices": list(s.devices)}
                          for s in SOCS], indent=2))
        return 0
    print(f"{'name':<10} {'soc_model':>9} {'htp_arch':>8} {'vtcm_mb':>7}  aliases / marketing name / devices")
    for s in SOCS:
        print(f"{s.name:<10} {s.soc_model:>9} {'v' + str(s.htp_arch):>8} {s.vtcm_mb:>7}  "
              f"{', '.join(s.aliases) + ' / ' if s.aliases else ''}{s.marketing}"
              f"{' / ' + ', '.join(s.devices) if s.devices else ''}")
    return 0


COMMAND = Command("targets", "list known SoCs", arguments, run)
