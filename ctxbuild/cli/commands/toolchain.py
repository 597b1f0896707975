"""`ctxbuild toolchain list|provision`: what is provisioned, and provisioning ahead of a build (offline use)."""
from __future__ import annotations

import argparse
import json

from ctxbuild.cli.parser import Command, Parser


def arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="toolchain_cmd", required=True, parser_class=Parser)
    listing = sub.add_parser("list", help="the provisioned toolchains and the published releases")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    provision = sub.add_parser("provision", help="provision a toolchain now (pip; $CTXBUILD_WHEELHOUSE for offline)")
    provision.add_argument("spec", help="an onnxruntime-qnn release (2.3.0) or qairt=2.47")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.toolchain import choose, provision
    from ctxbuild.toolchain.installed import version
    from ctxbuild.toolchain.runtimes import PUBLISHED

    if args.toolchain_cmd == "provision":
        spec: str | dict[str, str] = args.spec  # 2.3.0, or KEY=VERSION[,...] as `check --runtime` takes
        if "=" in args.spec:
            spec = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in args.spec.split(",") if p.strip())}
        tc = choose.choose(spec, f"toolchain provision {args.spec}", version("onnxruntime-qnn"))
        if tc is None:
            print(f"the installed toolchain (onnxruntime-qnn {version('onnxruntime-qnn')}) serves {args.spec}: "
                  "nothing to provision")
            return 0
        from ctxbuild.engine.console import Console

        console = Console(json=True)  # its lines on stderr: stdout says what was provisioned
        info = provision.ensure(tc, say=console.info, revalidate=True, live=console.live if console.tty() else None)
        print(f"{tc.name}: onnxruntime-qnn {info['onnxruntime-qnn']} (QAIRT {info['qairt']}), onnxruntime "
              f"{info['onnxruntime']} in {provision.root() / tc.name}")
        return 0
    rows = provision.listing()
    if args.json:
        print(json.dumps({"installed": {"onnxruntime-qnn": version("onnxruntime-qnn"),
                                        "onnxruntime": version("onnxruntime")},
                          "provisioned": rows, "published": PUBLISHED}, indent=2))
        return 0
    have = {r["name"]: r for r in rows}
    print(f"{'onnxruntime-qnn':<16} {'QAIRT':<9} state")
    for plugin, qairt in PUBLISHED.items():
        row = have.get(choose.Toolchain(plugin).name)
        state = ("installed (ctxbuild's own environment)" if plugin == version("onnxruntime-qnn") else
                 "not provisioned" if row is None else "unfinished (made again on next use)" if row.get("unfinished")
                 else f"damaged: {row['damaged']} (`ctxbuild toolchain provision {plugin}` repairs it)"
                 if row.get("damaged") else f"provisioned, {row['bytes'] / 2**20:.0f} MiB, {row['path']}")
        print(f"{plugin:<16} {qairt:<9} {state}")
    return 0


COMMAND = Command("toolchain", "toolchains: list those provisioned, provision one ahead (offline use)", arguments, run)
