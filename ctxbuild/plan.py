"""Plan: recipes -> a networkx DiGraph of Actions (edges are files), validated and deduplicated."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from .action import Action, short_hash
from .errors import PlanError
from .recipe import Graph, Recipe, RecipeSet
from .targets import Target

QUANTIZED = ("int16", "int8")
# (activation, weight) quant types per precision; names of onnxruntime.quantization.QuantType members.
QUANT_TYPES = {"int16": ("QUInt16", "QUInt8"), "int8": ("QUInt8", "QUInt8")}


@dataclass
class Plan:
    out: Path
    graph: nx.DiGraph  # nodes: action ids (attr "action"); edge u->v: v reads a file u writes (attr "files")
    recipes: RecipeSet

    @property
    def actions(self) -> list[Action]:
        return [self.graph.nodes[n]["action"] for n in nx.topological_sort(self.graph)]

    def artifacts(self) -> list[dict[str, Any]]:
        """Deliverables (for the manifest): outputs of compile/bundle actions, with their recipe and target."""
        rows = []
        for a in self.actions:
            if a.kind in ("compile", "bundle"):
                for role, path in a.outputs.items():
                    rows.append({"action": a.id, "recipe": a.recipes[0], "target": a.target, "role": role,
                                 "path": str(Path(path).relative_to(self.out)), "graphs": a.params.get("graphs")})
        return rows


def make_plan(recipes: RecipeSet, out: Path) -> Plan:
    out = out.resolve()
    actions: dict[str, Action] = {}
    for recipe in recipes.recipes:
        for a in _recipe_actions(recipe, out):
            _add(actions, a)
    graph = _graph(actions)
    return Plan(out, graph, recipes)


def _add(actions: dict[str, Action], a: Action) -> None:
    have = actions.get(a.id)
    if have is None:
        actions[a.id] = a
    elif have.identity() == a.identity():  # the same work for another recipe: one node
        have.recipes += [r for r in a.recipes if r not in have.recipes]
        have.recipe_files += [f for f in a.recipe_files if f not in have.recipe_files]
    else:
        raise PlanError(f"{a.recipe_files[0]}:1: action '{a.id}' clashes with the one from "
                        f"{', '.join(have.recipe_files)}", "rename one of the recipes")


def _recipe_actions(recipe: Recipe, out: Path) -> list[Action]:
    work = out / ".ctxbuild" / "work"
    acts: list[Action] = []
    compile_inputs: list[str] = []
    for g in recipe.graphs:
        prepared, a = _prepare(recipe, g, work)
        acts.append(a)
        model = prepared
        if recipe.precision in QUANTIZED:
            model, q = _quantize(recipe, g, prepared, work)
            acts.append(q)
        compile_inputs.append(model)
    if recipe.is_bundle:
        return acts  # bundle actions are planned by the bundle module (issue 4)
    for t in recipe.targets:
        acts.append(_compile(recipe, recipe.graphs[0], compile_inputs[0], t, out))
    return acts


def _common(recipe: Recipe) -> dict[str, Any]:
    return {"recipes": [recipe.name], "recipe_files": [str(recipe.file)]}


def _prepare(recipe: Recipe, g: Graph, work: Path) -> tuple[str, Action]:
    params = {"inputs": {k: list(v) for k, v in sorted(g.inputs.items())},
              # QDQ models skip the optimizer: constant folding would fold weight DequantizeLinear away.
              "optimize": recipe.precision != "qdq"}
    # Named by model and content, not recipe: recipes preparing one model the same way share the node.
    h = short_hash(["prepare", params, str(g.model)])
    stem = g.model.stem
    path = str(work / f"{stem}-{h}" / "prepared.onnx")
    a = Action(id=f"prepare/{stem}-{h}", kind="prepare", description=f"prepare {stem}",
               inputs={"model": str(g.model)}, outputs={"model": path}, params=params, **_common(recipe))
    return path, a


def _quantize(recipe: Recipe, g: Graph, prepared: str, work: Path) -> tuple[str, Action]:
    cal = g.calibration
    assert cal is not None  # recipe validation requires calibration for quantized precisions
    act, weight = QUANT_TYPES[recipe.precision]
    params = {"activation_type": act, "weight_type": weight, "samples": cal.samples, "random": cal.random,
              "inputs": {k: list(v) for k, v in sorted(g.inputs.items())}}
    watch = [str(cal.dir)] if cal.dir else []  # its *contents* are keyed (discovered inputs), not its path
    h = short_hash(["quantize", params, prepared, watch])
    stem = g.model.stem
    path = str(work / f"{stem}-{h}" / f"quantized.{recipe.precision}.onnx")
    a = Action(id=f"quantize/{stem}-{h}", kind="quantize", description=f"quantize {stem} ({recipe.precision})",
               inputs={"model": prepared}, outputs={"model": path}, params=params, watch=watch,
               **_common(recipe))
    return path, a


def provider_options(recipe: Recipe, t: Target) -> dict[str, str]:
    opts = {"soc_model": t.soc_model, "htp_arch": t.htp_arch}
    vtcm = recipe.compile.vtcm_mb if recipe.compile.vtcm_mb is not None else t.vtcm_mb
    if vtcm is not None:
        opts["vtcm_mb"] = str(vtcm)
    if recipe.compile.optimization_mode is not None:
        opts["htp_graph_finalization_optimization_mode"] = str(recipe.compile.optimization_mode)
    if recipe.precision == "fp16":
        opts["enable_htp_fp16_precision"] = "1"
    opts.update(dict(recipe.compile.provider_options))
    return dict(sorted(opts.items()))


def _compile(recipe: Recipe, g: Graph, model: str, t: Target, out: Path) -> Action:
    d = out / t.name / recipe.name
    outputs = {"ctx": str(d / f"{recipe.name}_ctx.onnx")}
    if not recipe.compile.embed:
        outputs["bin"] = str(d / f"{recipe.name}_ctx_qnn.bin")
    params = {"provider_options": provider_options(recipe, t), "embed": recipe.compile.embed,
              "cpu_fallback": recipe.compile.cpu_fallback, "precision": recipe.precision,
              "graphs": [g.name]}
    return Action(id=f"compile/{recipe.name}@{t.name}", kind="compile",
                  description=f"compile {recipe.name}@{t.name}", inputs={"model": model}, outputs=outputs,
                  params=params, target=t.as_dict(), pool="compile", **_common(recipe))


def _graph(actions: dict[str, Action]) -> nx.DiGraph:
    g = nx.DiGraph()
    producer: dict[str, str] = {}
    for a in actions.values():
        g.add_node(a.id, action=a)
        for path in a.outputs.values():
            if path in producer:
                other = actions[producer[path]]
                raise PlanError(f"{a.recipe_files[0]}:1: {a.id} and {other.id} (from {other.recipe_files[0]}) "
                                f"both write {path}", "give the recipes distinct names")
            producer[path] = a.id
    for a in actions.values():
        for path in a.inputs.values():
            if path in producer:
                g.add_edge(producer[path], a.id, files=[path])
            elif not Path(path).exists():
                raise PlanError(f"{a.recipe_files[0]}:1: {a.id} reads {path}, which no action makes and does "
                                "not exist", "check the path in the recipe")
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return g
    raise PlanError(f"{actions[cycle[0][0]].recipe_files[0]}:1: actions form a cycle: "
                    + " -> ".join(u for u, _ in cycle), "an action cannot consume its own outputs")
