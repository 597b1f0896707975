"""An `llm:` recipe's actions: split once (it also records each part's calls while the float graphs decode the
verification prompts), quantize once per part (over all its AR x CL graphs), then per target one weight-shared
`bundle` per part, one `llm_part_eval` per part (its graphs compiled alone inside it, run on the simulator on the
recorded calls; parts side by side), `llm_package` and `llm_genai` (the shipped genai_config.json run by
onnxruntime-genai on its CPU twin).

A CL added re-runs the split (it writes every graph) and the quantizes; the bundles and part checks re-run (their
graph lists change). Measured in docs/measured.md (LLMs).

LoRA (`llm.adapters`): the split keeps the slots as inputs of the graphs reading them, the quantizes calibrate over
no adapter + the `calibrate` set, and per target each adapter gets one `adapter` action per graph with slots (its
`.onnx_adapter`, ctxbuild/plan/adapters.py) and one `llm_eval` decoding with it bound through the whole chain of
parts, on single-graph twins compiled by their own `compile` actions (the per-part design does not cover adapters
yet). Neither feeds a compile."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from ctxbuild.llm.genai_config import helper_names
from ctxbuild.recipes.llm import LlmSpec
from ctxbuild.llm.static import GraphSpec, records_name, records_role, specs, weights_name, weights_role
from ctxbuild.plan.adapters import adapter_actions, calibration_inputs
from ctxbuild.plan.llm_quality import quality_cpu, quality_float, quality_gate
from ctxbuild.recipes.adapters import Adapter, Adapters
from ctxbuild.digests import short_hash, source_digest
from ctxbuild.plan.action import Action
from ctxbuild.plan.steps import common_params, provider_options
from ctxbuild.recipes.objects import Recipe
from ctxbuild.recipes.targets import Target

_PKG = Path(__file__).resolve().parent.parent
# what llm_split's graphs are made by, besides onnx: the exporters' rewrites, the static cut, the RMSNorm fusion
SPLIT_CODE = (*(_PKG / "llm" / f for f in ("exporters", "static.py", "canonical.py", "convention.py", "norms.py", "mask.py")),
              *(_PKG / "graph" / "legalize" / f for f in ("rmsnorm.py", "graphview.py")))


def llm_actions(recipe: Recipe, out: Path, verify: bool) -> list[Action]:
    spec = recipe.llm
    assert spec is not None
    graphs = specs(spec.parts, list(spec.sequence_lengths), list(spec.context_lengths))
    work = out / ".ctxbuild" / "work" / "llm"
    split = _split(recipe, spec, graphs, work)
    if spec.alpha:  # switch: alpha: lora_alpha is the one slot, each adapter a one-hot value of it (split writes them)
        recipe, spec = _alpha_as_slot(recipe, spec, split)
    acts = [split]
    verify = verify and recipe.verify.get("enabled", True)
    # the float export's quality figures, once: what the quality gates and auto's candidates are measured against
    floats = quality_float(recipe, spec, work) if verify or spec.precision == "auto" and not spec.adapters else None
    compiled = dict(split.outputs)  # graph -> what the compiler reads (float for fp16)
    for p in range(spec.parts):
        if spec.precision != "fp16":
            q = _quantize(recipe, spec, graphs, p, split, floats, work)
            acts.append(q)
            compiled.update(q.outputs)
    cpu = None
    if verify:  # the QDQ parts' on the CPU once (every target's)
        assert floats is not None
        cpu = quality_cpu(recipe, spec, graphs, split, compiled, floats, work) if spec.precision != "fp16" else None
    acts += [a for a in (floats, cpu) if a is not None]
    for t in recipe.targets:
        bundles = [_bundle(recipe, [g for g in graphs if g.part == p], compiled, split, t, out) for p in range(spec.parts)]
        acts += bundles
        twins: dict[str, Action] = {}  # single-graph twins compiled alone and kept (the simulator's, QNN-NOTES)
        if verify:
            # the adapters' whole-chain decode needs every graph's; the quality gates the largest CL's
            chained = graphs if spec.adapters else [g for g in graphs if g.cl == max(spec.context_lengths)]
            twins = {g.name: _twin(recipe, g, compiled, split, t, work / "twins" / t.name / recipe.name) for g in chained}
            acts += twins.values()
            # each part on the calls the float decode recorded: those twins, the others compiled inside (not kept)
            acts += [_part_eval(recipe, spec, graphs, p, split, compiled, b, twins, t, out) for p, b in enumerate(bundles)]
        if spec.adapters:
            acts += _adapters(recipe, spec, graphs, split, compiled, list(twins.values()), bundles, t, out)
        package = _package(recipe, spec, bundles, split, t, out)
        acts.append(package)
        if verify:  # the whole model's quality: a verdict on the bundles and the config naming them
            assert floats is not None
            acts.append(quality_gate(recipe, spec, chained, split, compiled, twins, floats, cpu, [*bundles, package], t,
                                     out))
        if verify:
            acts.append(_genai(recipe, spec, graphs, split, compiled, bundles, package, t, out))
    roots = sorted({str(recipe.file.parent), str(spec.model.parent)})  # as recipes/llm.py confines them
    made = {p for a in acts for p in a.outputs.values()}  # llm_genai reads llm_package's tokenizer copies in OUT
    for a in acts:  # checked again whenever an action reads them (userfiles.py): links may be retargeted
        a.confine = {"prompt:": roots, "prompt_tokenizer": roots,
                     **{role: roots for role, path in a.inputs.items()
                        if role.startswith("tokenizer:") and path not in made}}
    return acts



def _split(recipe: Recipe, spec: LlmSpec, graphs: list[GraphSpec], work: Path) -> Action:
    params = {"parts": spec.parts, "sequence_lengths": list(spec.sequence_lengths),
              "context_lengths": list(spec.context_lengths), "graphs": [g.name for g in graphs],
              "check": {"prompts": spec.verify_prompts, "tokens": spec.generate,
                        "original_tokens": spec.genai_tokens}}  # the original's, kept for llm_genai
    if spec.adapters:  # only then: the keys of recipes without adapters stay as they were
        params["adapter_slots"] = {"patterns": list(spec.adapters.slots), "scaling": spec.adapters.scaling}
    if spec.alpha:  # the branches attached to the canonical decoder, lora_alpha its slot
        params["alpha"] = spec.alpha.param()
        params["adapter_slots"] = {"patterns": [spec.alpha.input], "scaling": None}
    h = short_hash(["llm_split", params, str(spec.model)])
    # the rewrites into the canonical form and the static cut: a change re-splits (the key changes, and the spec,
    # so ninja re-runs it) without an ACTION_SCHEMA_VERSION bump; not in the node's name
    params["split_code"] = source_digest(*SPLIT_CODE)
    d = work / f"{recipe.name}-{h}"
    outputs = {"layout": str(d / "layout.json")}
    if spec.alpha:
        outputs.update({f"alpha:{a.name}": str(d / f"alpha_{a.name}.npz") for a in spec.alpha.items})
    outputs.update({f"model:{g.name}": str(d / f"{g.name}.onnx") for g in graphs})
    outputs.update({weights_role(p): str(d / weights_name(p, spec.parts)) for p in range(spec.parts)})
    outputs.update({records_role(p): str(d / records_name(p, spec.parts)) for p in range(spec.parts)})
    # sorted: the depfile names the outputs in the order the spec file (sorted JSON) gives them, which must be ninja's
    return Action(id=f"llm_split/{recipe.name}-{h}", kind="llm_split",
                  description=f"static graphs of {spec.model.name} ({len(graphs)})",
                  inputs={"model": str(spec.model), **prompt_tokenizer(spec), **(spec.alpha.files() if spec.alpha else {})},
                  outputs=dict(sorted(outputs.items())), params=params, watch=[str(spec.prompts)], **common_params(recipe))


def _alpha_as_slot(recipe: Recipe, spec: LlmSpec, split: Action) -> tuple[Recipe, LlmSpec]:
    """The alpha switch in the terms the llm actions know: the slot `lora_alpha` (an input of every graph with a
    branch, default all zeros) and one adapter per alpha index, the one-hot value llm_split writes (`alpha:<name>`):
    calibrated over each, bound as an .onnx_adapter for its token check, and fed as a plain input by an app."""
    assert spec.alpha is not None
    items = tuple(Adapter(a.name, Path(split.outputs[f"alpha:{a.name}"]), (), None) for a in spec.alpha.items)
    adapters = Adapters((spec.alpha.input,), None, items, tuple(a.name for a in items))
    recipe = copy.copy(recipe)
    recipe.adapters = adapters
    return recipe, dataclasses.replace(spec, adapters=adapters)


def _quantize(recipe: Recipe, spec: LlmSpec, graphs: list[GraphSpec], part: int, split: Action, floats: Action | None,
              work: Path) -> Action:
    mine = [g.name for g in graphs if g.part == part]
    params = {"part": part, "graphs": mine, "precision": spec.precision, "kv_cache": spec.kv_cache,
              "keep_8bit": list(spec.keep_8bit), "samples": spec.calibration_prompts, "tokens": spec.generate,
              "context_lengths": list(spec.context_lengths)}
    inputs = {"layout": split.outputs["layout"], **prompt_tokenizer(spec)}
    if spec.precision == "auto":
        inputs["records"] = split.outputs[records_role(part)]
    for g in graphs:  # calibration runs every part's float graphs
        inputs.update(graph_files(split.outputs, g, f"model:{g.name}"))
    if spec.quantization:  # w4a16, w8a16, auto
        params["quantization"] = spec.quantization
    if spec.precision == "auto":  # candidates judged on the part's recorded calls by the part check's gates, and in
        # the model by the part's share of the quality gates (not with adapters: their slots are inputs to feed)
        params["thresholds"] = {"min_token_agreement": spec.min_token_agreement, "min_cosine": spec.min_cosine,
                                "min_kv_cosine": spec.min_kv_cosine}
        if floats is not None and spec.quality is not None and not spec.adapters:
            inputs["float"] = floats.outputs["result"]
            params["thresholds"].update(max_ppl_ratio=spec.quality.max_ppl_ratio, min_agreement=spec.quality.min_agreement)
    if spec.adapters:  # calibrated over no adapter + the `calibrate` set: a change there re-quantizes
        params["adapters"], files = calibration_inputs(spec.adapters)
        inputs.update(files)
    h = short_hash(["llm_quantize", params, split.id])
    d = work / f"{recipe.name}-q{part + 1}-{h}"
    outputs = {f"model:{g}": str(d / f"{g}.onnx") for g in mine}
    outputs[weights_role(part)] = str(d / weights_name(part, spec.parts))
    return Action(id=f"llm_quantize/{recipe.name}.part{part + 1}-{h}", kind="llm_quantize",
                  description=f"quantize {recipe.name} part {part + 1} ({spec.precision})",
                  inputs=inputs, outputs=dict(sorted(outputs.items())), params=params, watch=[str(spec.prompts)],
                  **common_params(recipe))


def _options(recipe: Recipe, t: Target) -> dict[str, str]:
    opts = provider_options(recipe, t)
    if recipe.precision == "fp16":
        opts["enable_htp_fp16_precision"] = "1"
    q = recipe.llm.quantization if recipe.llm else None
    # block-wise int4 runs as LPBQ only so (docs/llm.md, Weight quantization); auto may choose it; per-channel weights
    # gave the same .bin size and simulator outputs with the option (onnxruntime-qnn 2.7.0)
    if q and (recipe.precision == "auto" or recipe.precision == "w4a16" and q["int4"] == "block"):
        opts["enable_block_quant_weight_optimization"] = "1"
    return dict(sorted(opts.items()))


def _bundle(recipe: Recipe, graphs: list[GraphSpec], compiled: dict[str, str], split: Action, t: Target,
            out: Path) -> Action:
    d = out / t.name / recipe.name
    part, parts = graphs[0].part + 1, graphs[0].name.rsplit("_", 1)[-1]
    inputs = {}
    for g in graphs:
        inputs.update({**graph_files(compiled, g, f"model:{g.name}"), **graph_files(split.outputs, g, f"reference:{g.name}")})
    outputs = {f"ctx:{g.name}": str(d / f"{g.name}_ctx.onnx") for g in graphs}
    outputs["bin"] = str(d / f"{recipe.name}_{part}_of_{parts}_qnn.bin")
    params = {"provider_options": _options(recipe, t), "cpu_fallback": False, "precision": recipe.precision,
              "graphs": [g.name for g in graphs]}
    if recipe.adapters:  # the wrappers get the slots' defaults from the float graphs (reference:)
        params["adapters"] = True
    return Action(id=f"bundle/{recipe.name}.part{part}@{t.name}", kind="bundle",
                  description=f"bundle {recipe.name} part {part} of {parts}@{t.name} ({len(graphs)} graphs)",
                  inputs=inputs, outputs=outputs, params=params, target=t.as_dict(), pool="compile",
                  **common_params(recipe))


def _twin(recipe: Recipe, g: GraphSpec, compiled: dict[str, str], split: Action, t: Target, d: Path) -> Action:
    params = {"provider_options": _options(recipe, t), "embed": False, "cpu_fallback": False,
              "precision": recipe.precision, "graphs": [g.name]}
    inputs = graph_files(compiled, g, "model")
    if recipe.adapters:  # its wrapper carries the slots' defaults too: an adapter binds to it as to the bundle's
        inputs.update(graph_files(split.outputs, g, "reference"))
    return Action(id=f"compile/{recipe.name}.{g.name}@{t.name}", kind="compile",
                  description=f"compile {recipe.name}.{g.name}@{t.name} (verification twin)",
                  inputs=inputs,
                  outputs={"ctx": str(d / f"{g.name}_ctx.onnx"), "bin": str(d / f"{g.name}_ctx_qnn.bin")},
                  params=params, target=t.as_dict(), pool="compile", **common_params(recipe))


def _part_eval(recipe: Recipe, spec: LlmSpec, graphs: list[GraphSpec], part: int, split: Action,
               compiled: dict[str, str], bundle: Action, twins: dict[str, Action], t: Target, out: Path) -> Action:
    """Part `part` checked on the calls the float decode recorded: its graphs compiled alone inside the action
    (the bundle's QDQ models and options), run on the simulator and the CPU against the float outputs."""
    mine = [g for g in graphs if g.part == part]
    inputs = {"layout": split.outputs["layout"], "records": split.outputs[records_role(part)]}
    for g in mine:
        inputs.update(graph_files(compiled, g, f"model:{g.name}"))
        if spec.adapters:  # the slots' defaults (the QDQ graphs take them as inputs)
            inputs.update(graph_files(split.outputs, g, f"reference:{g.name}"))
    inputs.update({f"bundle.{k}": v for k, v in bundle.outputs.items()})  # re-verified whenever it changes
    for g in mine:  # kept twins (the quality check's), used rather than compiled again
        if g.name in twins:
            inputs.update({f"twin:{g.name}": twins[g.name].outputs["ctx"], f"twin:{g.name}.bin": twins[g.name].outputs["bin"]})
    params = {"part": part, "parts": spec.parts, "graphs": [g.name for g in mine],
              "context_lengths": list(spec.context_lengths), "precision": spec.precision,
              "provider_options": _options(recipe, t), "prompts": spec.verify_prompts,
              "timeout_s": recipe.verify.get("timeout_s", 600), "simulator": spec.simulator,
              "thresholds": {"min_token_agreement": spec.min_token_agreement, "min_cosine": spec.min_cosine,
                             "min_kv_cosine": spec.min_kv_cosine}}
    name = f"part{part + 1}_of_{spec.parts}"
    return Action(id=f"llm_part_eval/{recipe.name}.part{part + 1}@{t.name}", kind="llm_part_eval",
                  description=f"verify {recipe.name} part {part + 1} of {spec.parts}@{t.name} (recorded calls)",
                  inputs=inputs, outputs={"result": str(out / t.name / recipe.name / "llm_verify" / f"{name}.json")},
                  params=params, target=t.as_dict(), pool="compile", **common_params(recipe))


def _eval(recipe: Recipe, spec: LlmSpec, graphs: list[GraphSpec], split: Action, compiled: dict[str, str],
          twins: list[Action], bundles: list[Action], t: Target, out: Path) -> Action:
    inputs = {"layout": split.outputs["layout"]}
    for g, twin in zip(graphs, twins):
        inputs.update({**graph_files(split.outputs, g, f"reference:{g.name}"),
                       f"twin:{g.name}": twin.outputs["ctx"], f"twin:{g.name}.bin": twin.outputs["bin"]})
        if spec.precision != "fp16":
            inputs.update(graph_files(compiled, g, f"qdq:{g.name}"))
    for p, b in enumerate(bundles):  # re-verified whenever a deliverable changes
        inputs.update({f"bundle{p + 1}.{k}": v for k, v in b.outputs.items()})
    inputs.update(prompt_tokenizer(spec))
    params = {"graphs": [g.name for g in graphs], "context_lengths": list(spec.context_lengths),
              "precision": spec.precision, "prompts": spec.verify_prompts,
              "generate": spec.generate, "timeout_s": recipe.verify.get("timeout_s", 600),
              "thresholds": {"min_token_agreement": spec.min_token_agreement, "min_cosine": spec.min_cosine}}
    return Action(id=f"llm_eval/{recipe.name}@{t.name}", kind="llm_eval", description=f"verify {recipe.name}@{t.name} (tokens)",
                  inputs=inputs, outputs={"result": str(out / t.name / recipe.name / "llm_verify.json")},
                  params=params, target=t.as_dict(), watch=[str(spec.prompts)], pool="compile", **common_params(recipe))


def _adapters(recipe: Recipe, spec: LlmSpec, graphs: list[GraphSpec], split: Action, compiled: dict[str, str],
              twins: list[Action], bundles: list[Action], t: Target, out: Path) -> list[Action]:
    """Per adapter: its `.onnx_adapter` for each graph with slots (checked against every part's slots: a file holds
    the whole model's), and, when verifying, an `llm_eval` decoding with those files bound."""
    assert spec.adapters is not None
    peers = {f"peer:{r}": p for b in bundles for r, p in b.outputs.items() if r.startswith("ctx:")}
    bindings: dict[str, list[Action]] = {}
    acts = []
    for g in graphs:
        if g.part not in spec.slot_parts:
            continue
        for a in adapter_actions(recipe, g.name, t, bundles[g.part], None, out):
            a.inputs.update({r: p for r, p in peers.items() if r != f"peer:ctx:{g.name}"})
            bindings.setdefault(a.params["name"], []).append(a)
            acts.append(a)
    if not twins:
        return acts
    base = _eval(recipe, spec, graphs, split, compiled, twins, [], t, out)
    for a in spec.adapters.items:
        v = Action(id=f"llm_eval/{recipe.name}+{a.name}@{t.name}", kind="llm_eval",
                   description=f"verify {recipe.name} with adapter {a.name}@{t.name} (tokens)",
                   inputs={**base.inputs, **{f"binding:{b.params['graph']}": b.outputs["binding"] for b in bindings[a.name]}},
                   outputs={"result": str(out / t.name / recipe.name / "adapters" / f"{a.name}_llm_verify.json")},
                   params={**base.params, "adapter": a.name, "calibrated": a.name in spec.adapters.calibrate},
                   target=t.as_dict(), watch=base.watch, pool="compile", **common_params(recipe))
        acts.append(v)
    return acts


def _package(recipe: Recipe, spec: LlmSpec, bundles: list[Action], split: Action, t: Target, out: Path) -> Action:
    inputs = {"layout": split.outputs["layout"]}
    for b in bundles:
        inputs.update({k: v for k, v in b.outputs.items() if k.startswith("ctx:")})
    params = {"recipe": recipe.name, "parts": spec.parts, "sequence_lengths": list(spec.sequence_lengths),
              "context_lengths": list(spec.context_lengths), "precision": spec.precision}
    d = out / t.name / recipe.name
    outputs = {"config": str(d / "genai_config.json")}
    outputs.update({f"stage:{n}": str(d / n) for n in helper_names(spec.parts, list(spec.sequence_lengths),
                                                                     max(spec.context_lengths))})
    for path in spec.tokenizer:  # copied for the runtime: inputs and outputs by name
        inputs[f"tokenizer:{path.name}"] = str(path)
        outputs[f"tokenizer:{path.name}"] = str(d / path.name)
    return Action(id=f"llm_package/{recipe.name}@{t.name}", kind="llm_package",
                  description=f"genai_config.json {recipe.name}@{t.name}", inputs=inputs, outputs=outputs, params=params,
                  target=t.as_dict(), **common_params(recipe))


def _genai(recipe: Recipe, spec: LlmSpec, graphs: list[GraphSpec], split: Action, compiled: dict[str, str],
           bundles: list[Action], package: Action, t: Target, out: Path) -> Action:
    """The shipped config run by onnxruntime-genai on its CPU twin (the largest CL's float static graphs in place of
    the wrappers it names) against the original export's tokens (the split decoded them: layout.json); cpu_twin/
    with the graphs that were compiled, for a PC."""
    cl = max(spec.context_lengths)
    mine = [g for g in graphs if g.cl == cl]
    wrapper = {g.name: Path(b.outputs[f"ctx:{g.name}"]).name for b in bundles for g in mine if f"ctx:{g.name}" in b.outputs}
    d = out / t.name / recipe.name / "cpu_twin"
    inputs = {"layout": split.outputs["layout"], "config": package.outputs["config"], **prompt_tokenizer(spec)}
    outputs = {"result": str(out / t.name / recipe.name / "genai_verify.json"), "config": str(d / "genai_config.json")}
    for role, path in package.outputs.items():
        if role.startswith(("stage:", "tokenizer:")):  # the helper stages as shipped; the tokenizer for the twin
            inputs[role] = path
            outputs[role] = str(d / Path(path).name)
    # the twin's parts: what was compiled, except that LoRA slots are required inputs of the QDQ graphs, which the
    # config does not feed (the wrappers hold their defaults): the float graphs keep them as initializers
    twin = split.outputs if spec.precision == "fp16" or spec.adapters else compiled
    for g in mine:
        inputs.update({**graph_files(split.outputs, g, f"float:{g.name}"), **graph_files(twin, g, f"twin:{g.name}")})
        outputs[f"graph:{g.name}"] = str(d / Path(twin[f"model:{g.name}"]).name)
        outputs[f"weights:{g.part}"] = str(d / Path(twin[weights_role(g.part)]).name)  # the part's graphs share it
    params = {"prompts": spec.verify_prompts, "tokens": spec.genai_tokens,
              "wrappers": {wrapper[g.name]: g.name for g in mine}, "twin": "qdq" if twin is compiled else "float"}
    # sorted: the depfile names the outputs in the spec file's (sorted) order, which must be ninja's
    return Action(id=f"llm_genai/{recipe.name}@{t.name}", kind="llm_genai",
                  description=f"verify {recipe.name}@{t.name} (genai_config.json on onnxruntime-genai)",
                  inputs=inputs, outputs=dict(sorted(outputs.items())), params=params, target=t.as_dict(),
                  watch=[str(spec.prompts)], **{**common_params(recipe), "toolchain": None})  # genai runs beside the installed onnxruntime


def graph_files(outputs: dict[str, str], g: GraphSpec, role: str) -> dict[str, str]:
    """Graph `g` of a split's or quantize's `outputs` as input `role`, its part's weight file as `role.data`: the
    part's graphs name one file (a role each, so memory estimates count it once per graph a process loads)."""
    return {role: outputs[f"model:{g.name}"], f"{role}.data": outputs[weights_role(g.part)]}


def prompt_tokenizer(spec: LlmSpec) -> dict[str, str]:
    """The tokenizer.json text prompts are read with, as an input of every action reading the prompts."""
    return {"prompt_tokenizer": str(spec.prompt_tokenizer)} if spec.prompt_tokenizer else {}
