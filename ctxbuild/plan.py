"""Plan: recipes -> a networkx DiGraph of Actions (edges are files), validated and deduplicated."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import networkx as nx

from . import kinds
from .action import Action, short_hash
from .layout import spec_name
from .errors import PlanError
from .quantization import describe
from .plan_adapters import adapter_actions, calibration_inputs, section_actions
from .recipe import Graph, Recipe, RecipeSet
from .targets import Target

QUANTIZED = ("int16", "int8")
# Verification thresholds (min cosine, min SNR dB) per precision, from runs of the examples on the simulator.
# auto: its candidates must meet int16's bar unless the recipe sets its own.
DEFAULT_THRESHOLDS = {"int16": (0.99, 20.0), "int8": (0.95, 12.0), "fp16": (0.999, 30.0), "qdq": (0.99, 20.0),
                      "auto": (0.99, 20.0)}
VERIFY_DEFAULT_MAX_BYTES = 256 * 2**20


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
            if not kinds.get(a.kind).deliverable or not _delivered(a, self.out):
                continue
            # a precision search's select verified its winner itself
            verifiers = [a.id] if a.kind == "select" else [
                v for v in self.graph.successors(a.id) if self.graph.nodes[v]["action"].kind == "verify"]
            twins = sorted({u for v in verifiers for u in self.graph.predecessors(v)
                            if self.graph.nodes[u]["action"].kind == "compile" and u != a.id})
            note = None if verifiers or a.kind == "prebuilt" else verification_note(self._recipe(a.recipes[0]))
            for role, path in a.outputs.items():
                if role in ("result", "search"):  # select's verification records, not artifacts
                    continue
                rows.append({"action": a.id, "recipe": a.recipes[0], "target": a.target, "role": role,
                             "path": str(Path(path).relative_to(self.out)), "graphs": a.params.get("graphs"),
                             "verified_by": sorted(verifiers), "twins": twins if a.kind == "bundle" else [],
                             **({"verify_note": note} if note else {})})
        return rows

    def _recipe(self, name: str) -> Recipe:
        return next(r for r in self.recipes.recipes if r.name == name)


def _delivered(a: Action, out: Path) -> bool:
    """Deliverables live under OUT/<target>/; verification twins live in the work dir."""
    return not Path(next(iter(a.outputs.values()))).is_relative_to(out / ".ctxbuild")


def make_plan(recipes: RecipeSet, out: Path, *, verify: bool = True) -> Plan:
    out = out.resolve()
    actions: dict[str, Action] = {}
    for recipe in recipes.recipes:
        for a in _recipe_actions(recipe, out, verify):
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


@dataclass
class Built:
    """A graph's models on the way to the compiler: the float reference and what gets compiled."""

    graph: Graph
    reference: str  # prepared model: shapes fixed, folded (the float model verification compares against)
    model: str  # what the compiler reads (quantized, or the prepared model for fp16/qdq)


def _recipe_actions(recipe: Recipe, out: Path, verify: bool) -> list[Action]:
    if recipe.prebuilt is not None:
        return [_prebuilt(recipe, t, out) for t in recipe.targets] + [
            s for t in recipe.targets for s in section_actions(recipe, t, out)]
    if recipe.precision == "auto":
        from .search import search_actions

        return search_actions(recipe, out)
    work = out / ".ctxbuild" / "work"
    acts: list[Action] = []
    built: list[Built] = []
    for g in recipe.graphs:
        prepared, a = _prepare(recipe, g, work)
        acts.append(a)
        model = prepared
        reference = a.outputs.get("reference", prepared)  # LoRA: slots with their defaults
        if recipe.precision in QUANTIZED:
            model, q = _quantize(recipe, g, prepared, work, recipe.quantization[0], reference)
            acts.append(q)
        built.append(Built(g, reference, model))
    verify = verify and verification_enabled(recipe)
    if recipe.is_bundle:
        for t in recipe.targets:
            bundle = _bundle(recipe, built, t, out)
            acts.append(bundle)
            for b in built:
                v = None
                if verify:  # the simulator cannot load a multi-graph binary: verify each graph's single-graph twin
                    twin = _compile(recipe, b, t, work / "twins" / t.name / recipe.name, name=f"{recipe.name}.{b.graph.name}")
                    v = _verify(recipe, b, t, twin, out, method="single-graph build (bundle)", bundle=bundle)
                    acts += [twin, v]
                if recipe.adapters:
                    acts += adapter_actions(recipe, b.graph.name, t, bundle, v, out)
    elif recipe.multi_soc:
        t = multi_soc_target(recipe.targets)
        flexible = _compile(recipe, built[0], t, out / t.name / recipe.name)
        acts.append(flexible)
        if verify:  # nor a multi-SoC one: verify a single-SoC build with the same options
            first = recipe.targets[0]
            twin = _compile(recipe, built[0], first, work / "twins" / first.name / recipe.name,
                            name=f"{recipe.name}.single", action_target=t)
            acts += [twin, _verify(recipe, built[0], t, twin, out, method=f"single-SoC build ({first.name})",
                                   artifact=flexible)]
    else:
        for t in recipe.targets:
            c = _compile(recipe, built[0], t, out / t.name / recipe.name)
            acts.append(c)
            v = _verify(recipe, built[0], t, c, out, method="direct") if verify else None
            acts += [v] if v else []
            if recipe.adapters:
                acts += adapter_actions(recipe, built[0].graph.name, t, c, v, out)
    return acts


def verification_enabled(recipe: Recipe) -> bool:
    """On by default for models small enough to simulate quickly; the recipe can force it either way."""
    if "enabled" in recipe.verify:
        return bool(recipe.verify["enabled"])
    return _model_bytes(recipe) <= VERIFY_DEFAULT_MAX_BYTES


def verification_note(recipe: Recipe) -> str | None:
    """Why a recipe's artifacts go unverified when the recipe did not say so itself (for the report)."""
    if "enabled" in recipe.verify or verification_enabled(recipe):
        return None
    return (f"not verified: the model's weights ({_model_bytes(recipe) / 2**20:.0f} MB with external data) are over "
            f"the {VERIFY_DEFAULT_MAX_BYTES >> 20} MB up to which simulator runs are on by default (an 8-bit graph of "
            "512 MB took 93 s to verify one sample on the x86 simulator); set `verify: true` in the recipe to run it")


def _model_bytes(recipe: Recipe) -> int:
    from .actions.modelio import weight_bytes

    return sum(weight_bytes(g.model) for g in recipe.graphs)


def multi_soc_target(targets: list[Target]) -> Target:
    """One flexible binary for several SoCs: comma-separated soc_model/htp_arch (is_multi_soc_ep_context=1)."""
    vtcm = [t.vtcm_mb for t in targets if t.vtcm_mb is not None]
    return Target("+".join(t.name for t in targets), ",".join(t.soc_model for t in targets),
                  ",".join(t.htp_arch for t in targets), min(vtcm) if vtcm else None)


def _common(recipe: Recipe) -> dict[str, Any]:
    return {"recipes": [recipe.name], "recipe_files": [str(recipe.file)]}


def _prepare(recipe: Recipe, g: Graph, work: Path) -> tuple[str, Action]:
    params = {"inputs": {k: list(v) for k, v in sorted(g.inputs.items())},
              # QDQ models skip the optimizer: constant folding would fold weight DequantizeLinear away.
              "optimize": recipe.precision != "qdq"}
    if recipe.adapters:  # LoRA: slots become optional inputs; "reference" keeps their defaults
        params["adapter_slots"] = {"patterns": list(recipe.adapters.slots), "scaling": recipe.adapters.scaling}
    # Named by model and content, not recipe: recipes preparing one model the same way share the node.
    h = short_hash(["prepare", params, str(g.model)])
    stem = g.model.stem
    path = str(work / f"{stem}-{h}" / "prepared.onnx")
    outputs = _model_files("model", path)
    if recipe.adapters:
        outputs.update(_model_files("reference", str(Path(path).with_name("reference.onnx"))))
    a = Action(id=f"prepare/{stem}-{h}", kind="prepare", description=f"prepare {stem}",
               inputs={"model": str(g.model)}, outputs=outputs, params=params, **_common(recipe))
    return path, a


def _model_files(role: str, path: str) -> dict[str, str]:
    """A model ctxbuild writes comes with its external data file (`<model>.data`, see actions/prepare.py)."""
    return {role: path, f"{role}.data": path + ".data"}


def _quantize(recipe: Recipe, g: Graph, prepared: str, work: Path, settings: dict[str, Any],
              reference: str | None = None) -> tuple[str, Action]:
    """`settings`: one of recipe.quantization (quantization.settings()); its name is a label, not a parameter.
    `reference`: the float model with LoRA slots as inputs (recipes with adapters)."""
    cal = g.calibration
    assert cal is not None  # recipe validation requires calibration for quantized precisions
    quant = {k: v for k, v in settings.items() if k not in ("name", "samples")}
    params = {"quantization": quant, "samples": settings["samples"] or cal.samples, "random": cal.random,
              "inputs": {k: list(v) for k, v in sorted(g.inputs.items())}}
    inputs = _model_files("model", prepared)
    if recipe.adapters and reference:  # LoRA: calibrate over the declared adapter set (a change recompiles)
        params["adapters"], more = calibration_inputs(recipe.adapters)
        inputs.update(more, **_model_files("reference", reference))
    watch = [str(cal.dir)] if cal.dir else []  # its *contents* are keyed (discovered inputs), not its path
    h = short_hash(["quantize", params, prepared, watch])
    stem = g.model.stem
    path = str(work / f"{stem}-{h}" / "quantized.onnx")
    a = Action(id=f"quantize/{stem}-{h}", kind="quantize",
               description=f"quantize {stem} ({describe(recipe.precision, settings)})",
               inputs=inputs, outputs=_model_files("model", path), params=params, watch=watch,
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


def _compile(recipe: Recipe, b: Built, t: Target, d: Path, *, name: str | None = None,
             action_target: Target | None = None, candidate: str | None = None) -> Action:
    """One graph for one target into directory `d`. `name` != recipe name: a verification twin.
    `candidate`: a precision-search candidate (files named as the deliverable, the id names the candidate)."""
    stem = name or recipe.name
    outputs = {"ctx": str(d / f"{stem}_ctx.onnx")}
    if not recipe.compile.embed:
        outputs["bin"] = str(d / f"{stem}_ctx_qnn.bin")
    if candidate:  # a candidate QNN cannot compile drops out of the search (compile.py), it does not stop it
        outputs["status"] = str(d / "compile_status.json")
    params = {"provider_options": provider_options(recipe, t), "embed": recipe.compile.embed,
              "cpu_fallback": recipe.compile.cpu_fallback, "precision": recipe.precision,
              "graphs": [b.graph.name]}
    if recipe.compile.split_outputs:  # only when set: existing action keys stay as they were
        params["split_outputs"] = _split_param(recipe.compile.split_outputs)
    if recipe.compile.quantized_io:
        params["quantized_io"] = True
    twin = " (verification twin)" if name else f" (candidate {candidate})" if candidate else ""
    ident = f"{stem}.{candidate}" if candidate else stem
    inputs = _model_files("model", b.model)
    if recipe.adapters:  # the wrapper gets the slots' defaults from the float reference
        inputs.update(_model_files("reference", b.reference))
    return Action(id=f"compile/{ident}@{t.name}", kind="compile", description=f"compile {stem}@{t.name}{twin}",
                  inputs=inputs, outputs=outputs, params=params,
                  target=(action_target or t).as_dict(), pool="compile", **_common(recipe))


def _split_param(v: bool | tuple[str, ...]) -> bool | list[str]:
    return list(v) if isinstance(v, tuple) else v


def _prebuilt(recipe: Recipe, t: Target, out: Path) -> Action:
    """A binary made elsewhere, wrapped for this target: same layout, cache and manifest as compiled ones.
    (No verification: there is no float model to compare with.)"""
    pb = recipe.prebuilt
    assert pb is not None
    d = out / t.name / recipe.name
    single = len(pb.graphs) == 1
    outputs = {"ctx": str(d / f"{recipe.name}_ctx.onnx")} if single else {
        f"ctx:{g}": str(d / f"{g}_ctx.onnx") for g in pb.graphs}
    if not recipe.compile.embed:
        outputs["bin"] = str(d / f"{recipe.name}_qnn.bin")
    params = {"graphs": list(pb.graphs), "embed": recipe.compile.embed, "quantized_io": pb.quantized_io,
              "soc_model": t.soc_model, "htp_arch": t.htp_arch}
    return Action(id=f"prebuilt/{recipe.name}@{t.name}", kind="prebuilt", description=f"wrap {recipe.name}@{t.name}",
                  inputs={"bin": str(pb.bin)}, outputs=outputs, params=params, target=t.as_dict(), **_common(recipe))


def _bundle(recipe: Recipe, built: list[Built], t: Target, out: Path) -> Action:
    d = out / t.name / recipe.name
    outputs = {f"ctx:{b.graph.name}": str(d / f"{b.graph.name}_ctx.onnx") for b in built}
    outputs["bin"] = str(d / f"{recipe.name}_qnn.bin")
    inputs = {k: v for b in built for k, v in _model_files(f"model:{b.graph.name}", b.model).items()}
    inputs.update({k: v for b in built for k, v in _model_files(f"reference:{b.graph.name}", b.reference).items()})
    params = {"provider_options": provider_options(recipe, t), "cpu_fallback": recipe.compile.cpu_fallback,
              "precision": recipe.precision, "graphs": [b.graph.name for b in built]}
    if recipe.adapters:  # the wrappers get the slots' defaults from the float references
        params["adapters"] = True
    return Action(id=f"bundle/{recipe.name}@{t.name}", kind="bundle",
                  description=f"bundle {recipe.name}@{t.name} ({len(built)} graphs)", inputs=inputs,
                  outputs=outputs, params=params, target=t.as_dict(), pool="compile", **_common(recipe))


def _verify(recipe: Recipe, b: Built, t: Target, compiled: Action, out: Path, *, method: str,
            bundle: Action | None = None, artifact: Action | None = None, candidate: str | None = None) -> Action:
    """Verify `compiled` on the simulator. When the deliverable cannot run there (a bundle, a multi-SoC
    binary), `compiled` is its twin and the deliverable is an input too: re-verified whenever it changes.
    A search `candidate` only measures (no thresholds, never fails on accuracy): the select action judges."""
    graph = b.graph
    label = f"{recipe.name}.{graph.name}" if recipe.is_bundle else recipe.name
    min_cos, min_snr = thresholds(recipe)
    v = recipe.verify
    samples_dir = (recipe.file.parent / v["dir"]).resolve() if v.get("dir") else (
        graph.calibration.dir if graph.calibration and graph.calibration.dir else None)
    params = {"graph": graph.name, "method": method, "precision": recipe.precision,
              "thresholds": {"min_cosine": min_cos, "min_snr_db": min_snr},
              "samples": v.get("samples", 4), "timeout_s": v.get("timeout_s", 300),
              "sample_source": "verification" if v.get("dir") else ("calibration" if samples_dir else "random"),
              "cpu_fallback": recipe.compile.cpu_fallback,
              "inputs": {k: list(x) for k, x in sorted(graph.inputs.items())}}
    if recipe.compile.split_outputs:  # the wrapper's re-joining Concat runs on the CPU
        params["split_outputs"] = _split_param(recipe.compile.split_outputs)
    if v.get("slices"):
        params["slices"] = v["slices"]
    inputs = {**_model_files("reference", b.reference), **_model_files("compiled", b.model),
              **{f"ctx.{k}": p for k, p in compiled.outputs.items()}}
    if bundle is not None:
        inputs.update({"bundle.ctx": bundle.outputs[f"ctx:{graph.name}"], "bundle.bin": bundle.outputs["bin"]})
    if artifact is not None:
        inputs.update({f"artifact.{k}": p for k, p in artifact.outputs.items()})
    d = out / t.name / recipe.name
    if candidate:
        del params["thresholds"]
        params["gate"] = False
        label, d = f"{label}.{candidate}", Path(compiled.outputs["ctx"]).parent
    return Action(id=f"verify/{label}@{t.name}", kind="verify", description=f"verify {label}@{t.name}",
                  inputs=inputs, outputs={"result": str(d / f"{graph.name if recipe.is_bundle else recipe.name}_verify.json")},
                  params=params, target=t.as_dict(), watch=[str(samples_dir)] if samples_dir else [],
                  pool="compile", **_common(recipe))


def thresholds(recipe: Recipe) -> tuple[float, float]:
    """(min cosine, min SNR dB): the recipe's, else the defaults of its precision."""
    min_cos, min_snr = DEFAULT_THRESHOLDS[recipe.precision]
    return recipe.verify.get("min_cosine", min_cos), recipe.verify.get("min_snr_db", min_snr)


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
