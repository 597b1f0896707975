"""`ctxbuild plan`: the action graph the recipes make, as text, JSON or Graphviz dot."""
from __future__ import annotations

import argparse
import json

from ctxbuild.cli import options
from ctxbuild.cli.parser import Command

EXAMPLES = """examples:
  ctxbuild plan --format dot | dot -Tsvg > plan.svg"""


def arguments(p: argparse.ArgumentParser) -> None:
    options.paths_out(p)
    p.add_argument("--format", choices=["text", "json", "dot"], default="text",
                   help="text (default), json (actions and edges) or dot (Graphviz)")


def run(args: argparse.Namespace) -> int:
    from ctxbuild.recipes import recipe
    from ctxbuild.plan.planner import make_plan

    plan = make_plan(recipe.load(args.paths), args.out)
    actions = plan.actions
    if args.format == "json":
        print(json.dumps({"actions": [a.to_spec() for a in actions],
                          "edges": [{"from": u, "to": v, "files": d["files"]} for u, v, d in plan.graph.edges(data=True)]},
                         indent=2))
    elif args.format == "dot":
        print("digraph ctxbuild {\n  rankdir=LR;")
        for a in actions:
            print(f'  "{a.id}" [label="{a.description}"];')
        for u, v in plan.graph.edges():
            print(f'  "{u}" -> "{v}";')
        print("}")
    else:
        for a in actions:
            deps = sorted(plan.graph.predecessors(a.id))
            print(f"{a.id}  [{', '.join(a.recipes)}]" + (f"  <- {', '.join(deps)}" if deps else ""))
    return 0


COMMAND = Command("plan", "print the action graph", arguments, run, EXAMPLES)
