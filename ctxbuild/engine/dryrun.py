"""A dry run (`ctxbuild build -n`, or a build under `make -n`): what a build would run, with nothing written.

When OUT's plan is current, ninja says what is out of date (`ninja -n -v`). ninja makes the output directories
of what it would run even then: the ones it made are removed again. Otherwise (no OUT yet, recipes changed
since) the plan is made in memory and every action the targets need is listed: a build re-plans and runs or
restores each one. Neither build.ninja nor OUT's state nor OUT itself is written.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.engine import ninja, outdir
from ctxbuild.engine.console import Console
from ctxbuild.layout import STATE, spec_name
from ctxbuild.plan import kinds


def plan_in_memory(out: Path, invocation: dict[str, Any]) -> dict[str, Any]:
    """What plan.json would hold (its actions and cache settings), planned and kept in memory."""
    from ctxbuild.recipes import recipe
    from ctxbuild.plan.planner import make_plan

    recipes = recipe.load([Path(p) for p in invocation["paths"]])
    outdir.check_placement(out, outdir.source_dirs(recipes), "recipe/model directory")
    plan = make_plan(recipes, out, verify=invocation["verify"])
    return {"actions": ninja.action_rows(plan), "cache": plan.recipes.cache}


def out_of_date(out: Path, state: dict[str, Any], targets: list[str]) -> list[dict[str, Any]] | None:
    """The actions ninja would run for `targets` in OUT (whose plan is current), in its order; None if ninja
    cannot tell (a broken build.ninja)."""
    missing = {d for a in state["actions"] for p in a["outputs"] for d in _ancestors(Path(p), out) if not d.exists()}
    try:
        commands = ninja.pending(out, targets)
    finally:
        for d in sorted(missing, key=lambda d: len(d.parts), reverse=True):
            try:
                d.rmdir()  # ninja made it; empty unless someone else wrote into it since
            except OSError:
                pass
    if commands is None:
        return None
    marker = f" {STATE}/actions/"  # the spec is an edge command's last word (as prerestore reads it)
    by_spec = {spec_name(a["id"]): a for a in state["actions"]}
    return [a for cmd in commands if (a := by_spec.get(cmd.rpartition(marker)[2])) is not None]


def needed(state: dict[str, Any], targets: list[str]) -> list[dict[str, Any]]:
    """Every action of `state` that `targets` (ninja's target names, as the driver passes them) need, upstream
    first."""
    by_id = {a["id"]: a for a in state["actions"]}
    todo = [a["id"] for a in state["actions"] if not targets or _phonies(a) & set(targets)]
    keep = set(todo)
    while todo:
        for dep in by_id[todo.pop()]["deps"]:
            if dep not in keep:
                keep.add(dep)
                todo.append(dep)
    return [a for a in state["actions"] if a["id"] in keep]


def show(out: Path, actions: list[dict[str, Any]], console: Console) -> int:
    """ninja's dry-run lines (`[1/3] compile tiny_cnn@SM8650`), or that nothing would run; with --json one document
    on stdout as well."""
    for i, a in enumerate(actions, 1):
        console.info(f"[{i}/{len(actions)}] {a['description']}")
    if not actions:
        console.info("ctxbuild: up to date, nothing would run")
    if console.json:
        print(json.dumps({"ok": True, "exit_code": 0, "error": None, "dry_run": True, "out": str(out),
                          "would_run": [{"id": a["id"], "description": a["description"]} for a in actions]},
                         indent=2))
    return 0


def _phonies(a: dict[str, Any]) -> set[str]:
    """The phony targets of build.ninja an action's outputs belong to (ninja.render writes them)."""
    names = {f"recipe/{r}" for r in a["recipes"]}
    if a["target"]:
        soc = a["target"]["name"]
        names |= {f"target/{soc}", *(f"{r}@{soc}" for r in a["recipes"])}
    if kinds.get(a["kind"]).verification:
        names.add("verify")
    return names


def _ancestors(path: Path, out: Path) -> list[Path]:
    """The directories between OUT (excluded) and `path`."""
    return [d for d in path.parents if d.is_relative_to(out) and d != out]
