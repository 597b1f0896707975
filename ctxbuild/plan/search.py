"""precision: auto planned as a staged search DAG. Per candidate of the ladder: a quantize and a CPU screen
(shared by the targets); per target a compile and a measuring verify; per target one `select` that picks the
first candidate meeting the thresholds and places its files at the normal output paths.

Candidates are staged, not all run: ninja cannot skip an edge on another's result, so every candidate's
heavy actions take a gate file (verify/gates.py) that a `search_step` action writes from the results of the
candidates before it (verify/ladder.py): `need` (any target still needs this candidate: quantize and
screen run) and `admit` per target (still needed there and not skipped as unable to pass, verify/predict.py:
compile and verify run). An action whose gate is closed writes placeholders in milliseconds. The edges are static, so
ninja keeps -j parallelism across models and targets, a rebuild is a no-op and everything restores from
the cache. Thresholds are parameters of the steps, the candidate verifies (early stop) and select only:
a threshold change never recompiles what ran; it may open a gate that was closed. See docs/recipes.md.

Targets are searched in the recipe's order, each later one behind the earlier ones (`siblings`): a candidate
that failed on an earlier target's simulator is skipped on the later ones (verify/predict.sibling_failure), so
their gates also read the earlier targets' verifies of the candidates up to theirs. `auto: {siblings: false}`
searches every target on its own.

The ladder ends with the fp16 rung (recipes/quantization.FP16_RUNG, unless `auto: {fp16: false}`): the prepared
model compiled with enable_htp_fp16_precision, with no quantize, no screen and no `need` step; its `admit` gates
open only when every integer candidate before it failed on that target.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild.plan.steps import (Built, common_params, compile_action, model_files, prepare_action, provider_options,
                                 quantize_action, thresholds, verify_action, verify_samples)
from ctxbuild.recipes.quantization import is_fp16, is_mixed, problem, settings
from ctxbuild.recipes.objects import Recipe
from ctxbuild.recipes.targets import Target
from ctxbuild.verify.predict import rules

# Samples the mixed rung's per-node diagnosis runs (each is a simulator run of a debug build per probe round).
DIAGNOSE_SAMPLES = 2

def search_actions(recipe: Recipe, out: Path) -> list[Action]:
    g = recipe.graphs[0]  # recipe validation: auto has one graph (no bundle)
    work = out / ".ctxbuild" / "work"
    prepared, prep = prepare_action(recipe, g, work)
    acts = [prep]
    ladders: dict[str, list[str]] = {}
    skipped: dict[str, list[dict[str, str]]] = {}
    for t in recipe.targets:
        why = {s["name"]: problem(s, t) for s in recipe.quantization}
        # the arch cannot run it: not a candidate for this target (listed as skipped)
        skipped[t.name] = [{"name": n, "reason": r} for n, r in why.items() if r]
        ladders[t.name] = [n for n, r in why.items() if not r]
        if not ladders[t.name]:
            raise_no_candidate(recipe, t, skipped[t.name])
    min_cos, min_snr = thresholds(recipe)
    thr = {"min_cosine": min_cos, "min_snr_db": min_snr}
    names = [t.name for t in recipe.targets]
    siblings = {t: names[:i] for i, t in enumerate(names) if i and recipe.search_siblings}
    screens: dict[str, Action] = {}
    verifies: dict[tuple[str, str], Action] = {}
    candidates: dict[str, list[tuple[dict[str, Any], Action, Action]]] = {t.name: [] for t in recipe.targets}
    models: dict[str, str] = {}  # quantization candidate -> its QDQ model
    settings_of: dict[str, str] = {}  # the mixed rung -> the file holding its settings (culprits)
    for s in recipe.quantization:
        n = s["name"]
        users = [t for t in recipe.targets if n in ladders[t.name]]
        if not users:
            continue
        upto = {t.name: ladders[t.name][:ladders[t.name].index(n) + 1] for t in users}
        if is_fp16(s):
            for t in users:
                d = work / "search" / t.name / recipe.name / n
                c, v, admit = _fp16_candidate(recipe, Built(g, prepared, prepared), t, out, d, upto[t.name],
                                              screens, verifies, thr, siblings)
                verifies[(t.name, n)] = v
                acts += [*admit, c, v]
                candidates[t.name].append((s, c, v))
            continue
        need = None
        if any(len(lad) > 1 for lad in upto.values()):  # first for no target: needed unless an earlier one passes
            need = _step(recipe, "need", n, upto, screens, verifies, thr, siblings,
                         work / "search-cpu" / recipe.name / n)
            acts.append(need)
        gate = need.outputs["gate"] if need else None
        if is_mixed(s):  # its settings: the culprits action's answer, which gates its quantize and screen
            assert gate is not None  # the mixed rung follows at least one quantization candidate
            decided = _culprits(recipe, Built(g, prepared, prepared), n, upto, screens, models, verifies, thr, gate,
                                work / "search-cpu" / recipe.name / n)
            acts.append(decided)
            gate = settings_of[n] = decided.outputs["gate"]
        model, q = quantize_action(recipe, g, prepared, work, s, gate=gate, search=True)
        models[n] = model
        built = Built(g, prepared, model)
        screens[n] = _screen(recipe, built, work / "search-cpu" / recipe.name / n, gate)
        acts += [q, screens[n]]
        for t in users:
            d = work / "search" / t.name / recipe.name / n
            admit = _step(recipe, "admit", n, {t.name: upto[t.name]}, screens, verifies, thr, siblings, d, t)
            c = compile_action(recipe, built, t, d, candidate=n)
            v = verify_action(recipe, built, t, c, out, method="direct", candidate=n)
            c.inputs["gate"] = v.inputs["gate"] = admit.outputs["gate"]
            v.params["early_stop"] = thr
            verifies[(t.name, n)] = v
            acts += [admit, c, v]
            candidates[t.name].append((s, c, v))
    for t in recipe.targets:
        # what the earlier targets measured: the source of this target's skips and of its agreement check
        measured = {f"sibling.{s}.{n}": v.outputs["result"] for (s, n), v in verifies.items()
                    if s in siblings.get(t.name, [])}
        acts.append(_select(recipe, t, out, candidates[t.name], skipped[t.name], screens, thr, settings_of,
                            siblings.get(t.name, []), measured))
    return acts


def _culprits(recipe: Recipe, b: Built, n: str, ladders: dict[str, list[str]], screens: dict[str, Action],
              models: dict[str, str], verifies: dict[tuple[str, str], Action], thr: dict[str, float],
              need: str, d: Path) -> Action:
    """The mixed rung's decision (actions/culprits.py): the per-node diagnosis of a failed candidate, from
    every quantization candidate's QDQ model, CPU screen and verifies before it."""
    bases = [s["name"] for s in recipe.quantization if s["name"] in models]
    sampling, watch = verify_samples(recipe, b.graph)
    inputs = {**model_files("reference", b.reference), "original": str(b.graph.model)}
    for j in bases:
        inputs.update({**model_files(f"model.{j}", models[j]), f"screen.{j}": screens[j].outputs["result"]})
        inputs.update({f"verify.{t}.{j}": verifies[(t, j)].outputs["result"] for t in ladders if (t, j) in verifies})
    inputs["gate"] = need
    targets = {t.name: t for t in recipe.targets if t.name in ladders}
    params = {"candidate": n, "bases": bases, "ladders": ladders, "thresholds": thr, "predict": rules(recipe.quantization),
              "settings": {s["name"]: {k: v for k, v in s.items() if k != "name"} for s in recipe.quantization
                           if s["name"] in models},
              "provider_options": {name: provider_options(recipe, t) for name, t in targets.items()},
              "no_int16_weights": sorted(name for name, t in targets.items()
                                         if problem({**settings({"weights": "int16"}), "name": ""}, t)),
              "diagnose_samples": DIAGNOSE_SAMPLES, "timeout_s": recipe.verify.get("timeout_s", 300), **sampling}
    cal = b.graph.calibration
    assert cal is not None  # recipe validation requires calibration for quantized precisions
    # the growing rounds quantize as the mixed candidate's quantize does (plan/steps.quantize_action)
    params["calibration"] = {"samples": cal.samples, "random": cal.random, "dir": bool(cal.dir)}
    if cal.dir:
        watch = [*watch, str(cal.dir)]
    if recipe.verify.get("slices"):
        params["slices"] = recipe.verify["slices"]
    return Action(id=f"culprits/{recipe.name}", kind="culprits",
                  description=f"search {recipe.name}: which nodes the {n} candidate keeps at higher precision",
                  inputs=inputs, outputs={"gate": str(d / "culprits.json")}, params=params, watch=watch,
                  **common_params(recipe))


def _fp16_candidate(recipe: Recipe, built: Built, t: Target, out: Path, d: Path, ladder: list[str],
                    screens: dict[str, Action], verifies: dict[tuple[str, str], Action],
                    thr: dict[str, float], siblings: dict[str, list[str]]) -> tuple[Action, Action, list[Action]]:
    """The fp16 rung on target `t`: the prepared model compiled and verified as `precision: fp16` plans it
    (plan/steps.py), gated by an `admit` over the integer candidates before it (none: it is the whole ladder)."""
    fp16 = replace(recipe, precision="fp16")  # enable_htp_fp16_precision, and fp16's memory model
    c = compile_action(fp16, built, t, d, candidate=ladder[-1])
    v = verify_action(fp16, built, t, c, out, method="direct", candidate=ladder[-1])
    v.params["early_stop"] = thr
    if len(ladder) == 1:
        return c, v, []
    admit = _step(recipe, "admit", ladder[-1], {t.name: ladder}, screens, verifies, thr, siblings, d, t)
    c.inputs["gate"] = v.inputs["gate"] = admit.outputs["gate"]
    return c, v, [admit]


def raise_no_candidate(recipe: Recipe, t: Target, skipped: list[dict[str, str]]) -> None:
    from ctxbuild.errors import RecipeError

    raise RecipeError(f"{recipe.file}:1: precision: auto has no candidate target {t.name} can run: "
                      + "; ".join(f"{s['name']}: {s['reason']}" for s in skipped),
                      "add a candidate with weights: uint8 to the quantization ladder")


def _step(recipe: Recipe, mode: str, n: str, ladders: dict[str, list[str]], screens: dict[str, Action],
          verifies: dict[tuple[str, str], Action], thr: dict[str, float], siblings: dict[str, list[str]], d: Path,
          t: Target | None = None) -> Action:
    """A gate for candidate `n`: from the screens (up to `n` itself when admitting), the verifies before it,
    and the sibling targets' verifies of the candidates the walk decides (`n` itself when admitting)."""
    inputs = {}
    for target, ladder in ladders.items():
        for j in ladder[:-1]:
            inputs[f"verify.{target}.{j}"] = verifies[(target, j)].outputs["result"]
        decided = ladder if mode == "admit" else ladder[:-1]
        for j in decided:
            if j in screens:  # not the fp16 rung: it has no screen
                inputs[f"screen.{j}"] = screens[j].outputs["result"]
            for s in siblings.get(target, []):
                if (s, j) in verifies:  # not a candidate the sibling's arch cannot run
                    inputs[f"verify.{s}.{j}"] = verifies[(s, j)].outputs["result"]
    where = f"@{t.name}" if t else ""
    params = {"mode": mode, "candidate": n, "ladders": ladders, "thresholds": thr,
              "predict": rules(recipe.quantization), "siblings": {k: v for k, v in siblings.items() if k in ladders}}
    return Action(id=f"search_step/{recipe.name}.{n}{where}", kind="search_step",
                  description=f"search {recipe.name}{where}: {mode} {n}?", inputs=inputs,
                  outputs={"gate": str(d / f"{mode}.json")}, params=params,
                  target=t.as_dict() if t else None, **common_params(recipe))


def _screen(recipe: Recipe, b: Built, d: Path, gate: str | None) -> Action:
    """The candidate's QDQ model on the CPU EP, on the samples its verifies use (same parameters)."""
    params, watch = verify_samples(recipe, b.graph)
    if recipe.verify.get("slices"):  # measured per slice as the verify does
        params["slices"] = recipe.verify["slices"]
    inputs = {**model_files("reference", b.reference), **model_files("model", b.model), "original": str(b.graph.model)}
    if gate:
        inputs["gate"] = gate
    return Action(id=f"screen/{recipe.name}.{d.name}", kind="screen",
                  description=f"screen {recipe.name} candidate {d.name} on the CPU", inputs=inputs,
                  outputs={"result": str(d / "screen.json")}, params=params, watch=watch, **common_params(recipe))


def _select(recipe: Recipe, t: Target, out: Path, candidates: list[tuple[dict[str, Any], Action, Action]],
            skipped: list[dict[str, str]], screens: dict[str, Action], thr: dict[str, float],
            settings_of: dict[str, str], siblings: list[str], measured: dict[str, str]) -> Action:
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
        if n in screens:
            inputs[f"{n}.screen"] = screens[n].outputs["result"]
        if n in settings_of:  # the mixed rung: its settings as decided
            inputs[f"{n}.settings"] = settings_of[n]
        inputs.update({f"{n}.{role}": p for role, p in c.outputs.items()})
        # No action ids here: they hash paths (OUT, the model's), and params are the select's key.
        table.append({"name": n, **({"precision": s["precision"]} if is_fp16(s) or is_mixed(s) else
                                    {"quantization": {k: x for k, x in s.items() if k != "name"}})})
    inputs.update(measured)
    params = {"thresholds": thr, "predict": rules(recipe.quantization), "candidates": table,
              "skipped": skipped, "graphs": [recipe.graphs[0].name], "precision": "auto", "siblings": siblings}
    many = f"{len(candidates)} candidate" + ("s" if len(candidates) != 1 else "")
    return Action(id=f"select/{recipe.name}@{t.name}", kind="select", description=f"select {recipe.name}@{t.name} ({many})",
                  inputs=inputs,
                  outputs=outputs, params=params, target=t.as_dict(), **common_params(recipe))


def candidate_actions(select: Any, actions: dict[str, Any], producer: dict[str, str]) -> dict[str, dict[str, str]]:
    """candidate -> {quantize, compile, verify}: the actions behind a select's inputs, for the candidates'
    costs in the report and manifest (kept in the plan state, out of every key). `producer`: path -> id."""
    found: dict[str, dict[str, str]] = {}
    for c in select.params["candidates"]:
        n = c["name"]
        compiled = producer[select.inputs[f"{n}.ctx"]]
        # the fp16 rung compiles the prepared model: no quantize of its own
        quantize = {} if c.get("precision") == "fp16" else {"quantize": producer[actions[compiled].inputs["model"]]}
        found[n] = {**quantize, "compile": compiled, "verify": producer[select.inputs[f"{n}.result"]]}
        if f"{n}.screen" in select.inputs:
            found[n]["screen"] = producer[select.inputs[f"{n}.screen"]]
    return found
