"""An `llm:` recipe's quality actions (ctxbuild/llm/quality.py): `llm_float_eval` once per export, text and prompts
(its id and key hold no recipe, precision or target: every recipe and target reading the same share it, and its cache
entry), `llm_quality_cpu` once per recipe (the QDQ parts are the same for every target), and per target an
`llm_quality` that chains the largest context length's single-graph twins on the simulator and gates both."""
from __future__ import annotations

from pathlib import Path

from ctxbuild.digests import short_hash
from ctxbuild.llm.static import GraphSpec, weights_role
from ctxbuild.plan.action import Action
from ctxbuild.plan.steps import common_params
from ctxbuild.recipes.llm import LlmSpec
from ctxbuild.recipes.objects import Recipe
from ctxbuild.recipes.targets import Target


def quality_float(recipe: Recipe, spec: LlmSpec, work: Path) -> Action:
    q = spec.quality
    assert q is not None
    params = {"text": str(q.text) if q.text_given else "ctxbuild's English text (734 words)",
              "segment": max(spec.context_lengths), "max_segments": q.segments, "tokens": q.tokens,
              "prompts": spec.verify_prompts, "context_lengths": [max(spec.context_lengths)]}
    inputs = {"model": str(spec.model)}
    if q.tokenizer is not None:  # without one the prompts' ids are the text (the result says so)
        inputs.update(text=str(q.text), tokenizer=str(q.tokenizer))
    if spec.prompt_tokenizer:
        inputs["prompt_tokenizer"] = str(spec.prompt_tokenizer)
    h = short_hash(["llm_float_eval", params, inputs, str(spec.prompts)])
    return Action(id=f"llm_float_eval/{spec.model.stem}-{h}", kind="llm_float_eval",
                  description=f"float perplexity and greedy text of {spec.model.name}", inputs=inputs,
                  outputs={"result": str(work / f"{spec.model.stem}-float-{h}" / "float_eval.json")}, params=params,
                  watch=[str(spec.prompts)], **{**common_params(recipe), "toolchain": None})


def quality_cpu(recipe: Recipe, spec: LlmSpec, graphs: list[GraphSpec], split: Action, compiled: dict[str, str],
                floats: Action, work: Path) -> Action:
    cl = max(spec.context_lengths)
    inputs = {"layout": split.outputs["layout"], "float": floats.outputs["result"]}
    for g in graphs:
        if g.cl == cl:  # each graph and its part's weight file (plan/llm.py graph_files' roles)
            inputs.update({f"qdq:{g.name}": compiled[f"model:{g.name}"], f"qdq:{g.name}.data": compiled[weights_role(g.part)]})
            if spec.adapters:  # the slots are required inputs of the QDQ graphs: fed the float graphs' defaults
                inputs.update({f"reference:{g.name}": split.outputs[f"model:{g.name}"],
                               f"reference:{g.name}.data": split.outputs[weights_role(g.part)]})
    q = spec.quality
    assert q is not None
    params = {"context_length": cl, "context_lengths": [cl],  # the CL the memory estimate's activations count
              "thresholds": {"max_ppl_ratio": q.max_ppl_ratio, "min_agreement": q.min_agreement}}
    return Action(id=f"llm_quality_cpu/{recipe.name}", kind="llm_quality_cpu",
                  description=f"quality of {recipe.name} ({spec.precision}, QDQ parts on the CPU)", inputs=inputs,
                  outputs={"result": str(work / f"{recipe.name}-quality-{short_hash([params, inputs])}" / "qdq_cpu.json")},
                  params=params, **common_params(recipe))


def quality_gate(recipe: Recipe, spec: LlmSpec, chained: list[GraphSpec], split: Action, compiled: dict[str, str],
                 twins: dict[str, Action], floats: Action, cpu: Action | None, delivered: list[Action], t: Target,
                 out: Path) -> Action:
    q = spec.quality
    assert q is not None
    cl = max(spec.context_lengths)
    inputs = {"layout": split.outputs["layout"], "float": floats.outputs["result"]}
    if cpu is not None:
        inputs["cpu"] = cpu.outputs["result"]
    if q.tokenizer is not None:
        inputs["tokenizer"] = str(q.tokenizer)
    for g in chained:
        if g.cl == cl:
            inputs.update({f"twin:{g.name}": twins[g.name].outputs["ctx"], f"twin:{g.name}.bin": twins[g.name].outputs["bin"],
                           # what the twins were compiled from: sized before they exist, for the memory estimate
                           f"qdq:{g.name}": compiled[f"model:{g.name}"], f"qdq:{g.name}.data": compiled[weights_role(g.part)]})
    for p, b in enumerate(delivered):  # the bundles and the config: re-verified whenever a deliverable changes
        inputs.update({f"delivered{p + 1}.{k}": v for k, v in b.outputs.items()})
    params = {"context_length": cl, "context_lengths": [cl], "precision": spec.precision, "subset": dict(q.simulator),
              "thresholds": {"max_ppl_ratio": q.max_ppl_ratio, "min_agreement": q.min_agreement},
              "timeout_s": recipe.verify.get("timeout_s", 600)}
    return Action(id=f"llm_quality/{recipe.name}@{t.name}", kind="llm_quality",
                  description=f"quality of {recipe.name}@{t.name} (perplexity, greedy agreement)", inputs=inputs,
                  outputs={"result": str(out / t.name / recipe.name / "llm_quality.json")}, params=params,
                  target=t.as_dict(), pool="compile", **common_params(recipe))
