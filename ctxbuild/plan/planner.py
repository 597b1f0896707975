"""Plan: recipes -> a networkx DiGraph of Actions (edges are files), validated and deduplicated."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import networkx as nx

from ctxbuild.plan import kinds
from ctxbuild.plan.action import Action
from ctxbuild.layout import spec_name
from ctxbuild.errors import PlanError
from ctxbuild.plan.adapters import adapter_actions, alpha_verify_action, section_actions
from ctxbuild.plan.packages import package_actions
from ctxbuild.recipes import precisions
from ctxbuild.recipes.objects import Recipe, RecipeSet
from ctxbuild.plan.steps import (Built, bundle_action, compile_action, multi_soc_target, prebuilt_action,
                                 prepare_action, quantize_action, verification_enabled, verification_note,
                                 verify_action)


@dataclass
class Plan:
    out: Path
    graph: nx.DiGraph  # nodes: action ids (attr "action"); edge u->v: v reads a file u writes (attr "files")
    recipes: RecipeSet

    @property
    def actions(self) -> list[Action]:
        return [self.graph.nodes[n]["action"] for n in nx.topological_sort(self.graph)]

    def artifacts(self) -> list[dict[str, Any]]:
        """Deliverables (for the manifest): outputs of compile/bundle actions, with the actions that verify
        them and, for bundles, the single-graph twins whose sizes measure the weight-sharing savings."""
        rows = []
        for a in self.actions:
            if not kinds.get(a.kind).deliverable or not a.delivered(self.out):
                continue
            kind = kinds.get(a.kind)
            # a deliverable that is a verification (a precision search's select) verified its winner itself
            verifiers = [a.id] if kind.verification else [
                v for v in self.graph.successors(a.id) if kinds.get(self.graph.nodes[v]["action"].kind).verdict]
            twins = sorted({u for v in verifiers for u in self.graph.predecessors(v)
                            if u != a.id and _single_graph_deliverable(t := self.graph.nodes[u]["action"])
                            and set(t.params.get("graphs") or [None]) <= set(a.params.get("graphs") or [])})  # llm: this part's
            # the savings compare with every graph compiled apart: twins of some graphs only (an LLM's quality chain
            # keeps the largest CL's) measure nothing
            if {g for u in twins for g in self.graph.nodes[u]["action"].params["graphs"]} != set(a.params.get("graphs") or []):
                twins = []
            note = None if verifiers or not kind.verified_here else verification_note(self._recipe(a.recipes[0]))
            for role, path in a.outputs.items():
                if role in ("result", "search"):  # select's verification records, not artifacts
                    continue
                rows.append({"action": a.id, "recipe": a.recipes[0], "target": a.target, "role": role,
                             "path": str(Path(path).relative_to(self.out)), "graphs": a.params.get("graphs"),
                             "verified_by": sorted(verifiers), "twins": twins if kind.multi_graph else [],
                             **({"verify_note": note} if note else {}),
                             **({"toolchain": a.toolchain} if a.toolchain else {}),
                             **({"runtimes": runtimes} if (runtimes := self._runtimes(a.recipes)) else {})})
        return rows

    def _runtimes(self, recipes: list[str]) -> list[dict[str, str]]:
        """The runtimes every recipe an action serves declares (the deploy gate checks its outputs on each)."""
        specs = [s for r in recipes for s in self._recipe(r).runtimes]
        return [s for i, s in enumerate(specs) if s not in specs[:i]]

    def _recipe(self, name: str) -> Recipe:
        return next(r for r in self.recipes.recipes if r.name == name)


def make_plan(recipes: RecipeSet, out: Path, *, verify: bool = True) -> Plan:
    out = out.resolve()
    actions: dict[str, Action] = {}
    for recipe in recipes.recipes:
        for a in _recipe_actions(recipe, out, verify):
            _add(actions, a)
    for a in package_actions(recipes.recipes, list(actions.values()), out):
        _add(actions, a)
    _check_name_lengths(actions.values(), out)
    graph = _graph(actions)
    return Plan(out, graph, recipes)


NAME_MAX = 255  # bytes per path component on Linux filesystems
TEMP_MARGIN = 24  # atomic writes and cache restores use `.<name>.tmp-<pid>-<random>` beside the file


def _check_name_lengths(actions: Iterable[Action], out: Path) -> None:
    """Recipe, graph, target and model names end up in file names (outputs, specs, logs, depfiles):
    one that is too long must be a recipe error, not `File name too long` from an action."""
    for a in actions:
        names = [spec_name(a.id) + ".d", *(part for p in a.outputs.values() for part in Path(p).relative_to(out).parts)]
        longest = max(names, key=lambda n: len(n.encode()))
        if len(longest.encode()) + TEMP_MARGIN > NAME_MAX:
            raise PlanError(f"{a.recipe_files[0]}:1: {a.description}: the file name {longest[:40]}... is "
                            f"{len(longest.encode())} bytes long; the filesystem allows {NAME_MAX - TEMP_MARGIN} here",
                            "shorten the recipe name (`name:`), its graph or target names, or the model's file name")


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


def _recipe_actions(recipe: Recipe, out: Path, verify: bool) -> list[Action]:
    if recipe.prebuilt is not None:
        return [prebuilt_action(recipe, t, out) for t in recipe.targets] + [
            s for t in recipe.targets for s in section_actions(recipe, t, out)]
    if recipe.llm is not None:
        from ctxbuild.plan.llm import llm_actions

        return llm_actions(recipe, out, verify)
    if recipe.precision == "auto":
        from ctxbuild.plan.search import search_actions

        return search_actions(recipe, out)
    work = out / ".ctxbuild" / "work"
    acts: list[Action] = []
    built: list[Built] = []
    for g in recipe.graphs:
        prepared, a = prepare_action(recipe, g, work)
        acts.append(a)
        model = prepared
        reference = a.outputs.get("reference", prepared)  # LoRA: slots with their defaults
        if precisions.quantized(recipe.precision):
            model, q = quantize_action(recipe, g, prepared, work, recipe.quantization[0], reference)
            acts.append(q)
        built.append(Built(g, reference, model))
    verify = verify and verification_enabled(recipe)
    if recipe.is_bundle:
        for t in recipe.targets:
            bundle = bundle_action(recipe, built, t, out)
            acts.append(bundle)
            for b in built:
                v = None
                if verify:  # the simulator cannot load a multi-graph binary: verify each graph's single-graph twin
                    twin = compile_action(recipe, b, t, work / "twins" / t.name / recipe.name, name=f"{recipe.name}.{b.graph.name}")
                    v = verify_action(recipe, b, t, twin, out, method="single-graph build (bundle)", bundle=bundle)
                    acts += [twin, v]
                if recipe.adapters:
                    acts += adapter_actions(recipe, b.graph.name, t, bundle, v, out)
    elif recipe.multi_soc:
        t = multi_soc_target(recipe.targets)
        flexible = compile_action(recipe, built[0], t, out / t.name / recipe.name)
        acts.append(flexible)
        if verify:  # nor a multi-SoC one: verify a single-SoC build with the same options
            first = recipe.targets[0]
            twin = compile_action(recipe, built[0], first, work / "twins" / first.name / recipe.name,
                            name=f"{recipe.name}.single", action_target=t)
            acts += [twin, verify_action(recipe, built[0], t, twin, out, method=f"single-SoC build ({first.name})",
                                   artifact=flexible)]
    else:
        for t in recipe.targets:
            c = compile_action(recipe, built[0], t, out / t.name / recipe.name)
            acts.append(c)
            v = verify_action(recipe, built[0], t, c, out, method="direct") if verify else None
            acts += [v] if v else []
            if recipe.adapters:
                acts += adapter_actions(recipe, built[0].graph.name, t, c, v, out)
            if recipe.alpha and v:
                acts.append(alpha_verify_action(recipe, v, c))
    return acts


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


def _single_graph_deliverable(action: Action) -> bool:
    kind = kinds.get(action.kind)
    return kind.deliverable and not kind.multi_graph and not kind.verification
