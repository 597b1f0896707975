"""precision: auto planned as a search DAG: per candidate of the ladder a quantize (shared by the targets), and
per target a compile and a measuring verify; per target one `select` that picks the first candidate meeting the
thresholds and places its files at the normal output paths.

Every candidate runs (ninja schedules them in parallel under the compile pool); none is skipped because an
earlier one passed. Thresholds are parameters of `select` alone, so a changed threshold re-decides from the
cached measurements without a single recompile; gating later candidates on earlier results would put the
thresholds (or a "skipped" marker that must never be cached) into the candidates' keys. See docs/recipes.md.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild.plan.steps import Built, common_params, compile_action, prepare_action, quantize_action, thresholds, verify_action
from ctxbuild.recipes.quantization import problem
from ctxbuild.recipes.recipe import Recipe
from ctxbuild.recipes.targets import Target


def search_actions(recipe: Recipe, out: Path) -> list[Action]:
    g = recipe.graphs[0]  # recipe validation: auto has one graph (no bundle)
    work = out / ".ctxbuild" / "work"
    prepared, prep = prepare_action(recipe, g, work)
    acts = [prep]
    built: dict[str, Built] = {}
    for s in recipe.quantization:
        model, q = quantize_action(recipe, g, prepared, work, s)
        acts.append(q)
        built[s["name"]] = Built(g, prepared, model)
    for t in recipe.targets:
        candidates, skipped = [], []
        for s in recipe.quantization:
            why = problem(s, t)
            if why:  # the arch cannot run it: not a candidate for this target (listed as skipped)
                skipped.append({"name": s["name"], "reason": why})
                continue
            d = work / "search" / t.name / recipe.name / s["name"]
            c = compile_action(recipe, built[s["name"]], t, d, candidate=s["name"])
            v = verify_action(recipe, built[s["name"]], t, c, out, method="direct", candidate=s["name"])
            acts += [c, v]
            candidates.append((s, c, v))
        if not candidates:
            raise_no_candidate(recipe, t, skipped)
        acts.append(_select(recipe, t, out, candidates, skipped))
    return acts


def raise_no_candidate(recipe: Recipe, t: Target, skipped: list[dict[str, str]]) -> None:
    from ctxbuild.errors import RecipeError

    raise RecipeError(f"{recipe.file}:1: precision: auto has no candidate target {t.name} can run: "
                      + "; ".join(f"{s['name']}: {s['reason']}" for s in skipped),
                      "add a candidate with weights: uint8 to the quantization ladder")


def _select(recipe: Recipe, t: Target, out: Path, candidates: list[tuple[dict[str, Any], Action, Action]],
            skipped: list[dict[str, str]]) -> Action:
    d = out / t.name / recipe.name
    outputs = {"ctx": str(d / f"{recipe.name}_ctx.onnx")}
    if not recipe.compile.embed:
        outputs["bin"] = str(d / f"{recipe.name}_ctx_qnn.bin")
    outputs["result"] = str(d / f"{recipe.name}_verify.json")
    outputs["search"] = str(d / f"{recipe.name}_search.json")
    inputs: dict[str, str] = {}
    table = []
    for s, c, v in candidates:
        n = s["name"]
        inputs[f"{n}.result"] = v.outputs["result"]
        inputs.update({f"{n}.{role}": p for role, p in c.outputs.items()})
        # No action ids here: they hash paths (OUT, the model's), and params are the select's key.
        table.append({"name": n, "quantization": {k: x for k, x in s.items() if k != "name"}})
    min_cos, min_snr = thresholds(recipe)
    params = {"thresholds": {"min_cosine": min_cos, "min_snr_db": min_snr}, "candidates": table,
              "skipped": skipped, "graphs": [recipe.graphs[0].name], "precision": "auto"}
    return Action(id=f"select/{recipe.name}@{t.name}", kind="select",
                  description=f"select {recipe.name}@{t.name} ({len(candidates)} candidates)", inputs=inputs,
                  outputs=outputs, params=params, target=t.as_dict(), **common_params(recipe))


