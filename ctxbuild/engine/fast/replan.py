"""Plan only when the recipes changed: the no-op path never imports the planner (networkx alone costs ~0.25 s).
It stats the generator inputs recorded at plan time, the way ninja itself decides whether build.ninja is
stale; a fresh OUT takes its plan from the plan cache when the same recipes were planned into it before."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ctxbuild.engine import ninja, outdir, owner
from ctxbuild.engine.options import BuildOptions, default_compile_jobs
from ctxbuild.errors import UsageError
from ctxbuild.layout import STATE
from ctxbuild.toolchain import installed as toolchain


def invocation(opts: BuildOptions) -> dict[str, Any]:
    return {"paths": sorted(str(p.resolve()) for p in opts.paths),
            "compile_jobs": opts.compile_jobs or default_compile_jobs(), "verify": opts.verify}


def ensure_planned(opts: BuildOptions) -> dict[str, Any]:
    """Re-plan if build.ninja is missing, the invocation changed, or a recipe/defaults file changed."""
    inv = invocation(opts)
    out = opts.out
    state = ninja.read_state(out, "plan.json")
    if not current(out, inv, state):
        plan_and_render(out, inv)
        state = ninja.read_state(out, "plan.json")
        assert state is not None
    return state


def current(out: Path, inv: dict[str, Any], state: dict[str, Any] | None) -> bool:
    """OUT's plan (`state`) was made for this invocation from the recipes as they are now."""
    return state is not None and ninja.read_state(out, "invocation.json") == inv and not _stale(out, state)


def _stale(out: Path, state: dict[str, Any]) -> bool:
    try:
        built = (out / "build.ninja").stat().st_mtime_ns
    except OSError:
        return True
    for p in state["generator_deps"]:
        try:
            if os.stat(p).st_mtime_ns > built:
                return True
        except OSError:
            return True  # a recipe or directory went away
    return False


def plan_and_render(out: Path, inv: dict[str, Any]) -> None:
    from ctxbuild.engine.fast import plancache

    if plancache.restore(out, inv):  # the same recipes were planned into this OUT path before
        toolchain.sdk_build_id(out / STATE)
        ninja.clean_dead(out, {a["id"] for a in (ninja.read_state(out, "plan.json") or {}).get("actions", [])})
        return
    from ctxbuild.recipes import recipe
    from ctxbuild.plan.planner import make_plan

    recipes = recipe.load([Path(p) for p in inv["paths"]])
    outdir.check_placement(out, outdir.source_dirs(recipes), "recipe/model directory")
    plan = make_plan(recipes, out, verify=inv["verify"])
    out.mkdir(parents=True, exist_ok=True)
    toolchain.sdk_build_id(out / STATE)  # warm the memo once, not in N parallel actions
    ninja.render(plan, compile_jobs=inv["compile_jobs"], invocation=inv)
    plancache.store(out, inv)


def regenerate(out: Path) -> None:
    """ninja's generator edge: re-plan with the recorded invocation. build.ninja names OUT as `.` (ninja runs in
    it), so plain `ninja` in a moved or copied OUT plans that OUT, never the original; it must be re-bound first."""
    out = out.resolve()
    inv = ninja.read_state(out, "invocation.json")
    if inv is None:
        raise UsageError(f"{out}: no recorded invocation; run `ctxbuild build` first")
    if not owner.bound(out):
        raise UsageError(f"{out} was moved or copied from another place (its plan names that place)",
                         f"run `ctxbuild build -o {out}` once: it re-binds OUT here")
    plan_and_render(out, inv)
