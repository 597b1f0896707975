"""One constructor per step of a graph's way to the device (prepare, quantize, compile, bundle, prebuilt,
verify): the Actions the planner and the precision search both create."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxbuild.digests import short_hash, source_digest
from ctxbuild.graph import LEGALIZE_DIR
from ctxbuild.plan.action import Action
from ctxbuild.recipes import precisions
from ctxbuild.recipes.quantization import describe
from ctxbuild.recipes.objects import Graph, Recipe
from ctxbuild.recipes.targets import Target
from ctxbuild.plan.adapters import calibration_inputs
from ctxbuild.recipes.paths import named_path


VERIFY_DEFAULT_MAX_BYTES = 256 * 2**20

@dataclass
class Built:
    """A graph's models on the way to the compiler: the float reference and what gets compiled."""

    graph: Graph
    reference: str  # prepared model: shapes fixed, folded, legalized (verification's fallback reference, diagnosis)
    model: str  # what the compiler reads (quantized, or the prepared model for fp16/qdq)

def verification_enabled(recipe: Recipe) -> bool:
    """On by default for models small enough to simulate quickly; the recipe can force it either way."""
    if "enabled" in recipe.verify:
        return bool(recipe.verify["enabled"])
    return model_bytes(recipe) <= VERIFY_DEFAULT_MAX_BYTES

def verification_note(recipe: Recipe) -> str | None:
    """Why a recipe's artifacts go unverified when the recipe did not say so itself (for the report)."""
    if "enabled" in recipe.verify or verification_enabled(recipe):
        return None
    return (f"not verified: the model's weights ({model_bytes(recipe) / 2**20:.0f} MB with external data) are over "
            f"the {VERIFY_DEFAULT_MAX_BYTES >> 20} MB up to which simulator runs are on by default (an 8-bit graph of "
            "512 MB took 93 s to verify one sample on the x86 simulator); set `verify: true` in the recipe to run it")

def model_bytes(recipe: Recipe) -> int:
    from ctxbuild.graph.modelio import weight_bytes

    return sum(weight_bytes(g.model) for g in recipe.graphs)

def multi_soc_target(targets: list[Target]) -> Target:
    """One flexible binary for several SoCs: comma-separated soc_model/htp_arch (is_multi_soc_ep_context=1)."""
    vtcm = [t.vtcm_mb for t in targets if t.vtcm_mb is not None]
    return Target("+".join(t.name for t in targets), ",".join(t.soc_model for t in targets),
                  ",".join(t.htp_arch for t in targets), min(vtcm) if vtcm else None)

def common_params(recipe: Recipe) -> dict[str, Any]:
    return {"recipes": [recipe.name], "recipe_files": [str(recipe.file)], "toolchain": recipe.toolchain}

def prepare_action(recipe: Recipe, g: Graph, work: Path) -> tuple[str, Action]:
    params = {"inputs": {k: list(v) for k, v in sorted(g.inputs.items())},
              # QDQ models skip the optimizer: constant folding would fold weight DequantizeLinear away.
              "optimize": recipe.precision != "qdq"}
    if g.outputs:  # `outputs:`: only the part computing them (absent otherwise: existing keys stay as they were)
        params["outputs"] = list(g.outputs)
    if g.input_values:  # `input_values:`: those inputs made constants (absent otherwise, as `outputs`)
        params["input_values"] = dict(sorted(g.input_values.items()))
    if recipe.toolchain:  # another onnxruntime: another node, not shared with the installed toolchain's
        params["toolchain"] = recipe.toolchain
    if recipe.rewrite is not True:  # prepare.rewrite: absent by default, so default prepares keep their keys
        params["rewrite"] = sorted(recipe.rewrite) if recipe.rewrite else False
    if recipe.adapters:  # LoRA: slots become optional inputs; "reference" keeps their defaults
        params["adapter_slots"] = {"patterns": list(recipe.adapters.slots), "scaling": recipe.adapters.scaling}
    more = {}
    if recipe.alpha:  # switch: alpha: the adapters' branches and the lora_alpha input; "reference" defaults it to 0
        params["alpha"] = recipe.alpha.param()
        more = recipe.alpha.files()
    watch: list[str] = []
    if recipe.rewrite is not False:  # the rewrites are checked on the samples verification reads (prepare.py)
        sampling, watch = verify_samples(recipe, g)
        params["check"] = {k: sampling[k] for k in ("samples", "sample_source")}
    # Named by model and content, not recipe: recipes preparing one model the same way share the node.
    h = short_hash(["prepare", params, str(g.model), watch])
    if recipe.rewrite is not False:  # a rule added or changed re-prepares (the spec changes: ninja re-runs it;
        # the key changes: no stale cache hit), without an ACTION_SCHEMA_VERSION bump; not in the node's name
        params["legalize_code"] = source_digest(LEGALIZE_DIR)
    stem = g.model.stem
    path = str(work / f"{stem}-{h}" / "prepared.onnx")
    outputs = model_files("model", path)
    if recipe.adapters or recipe.alpha:
        outputs.update(model_files("reference", str(Path(path).with_name("reference.onnx"))))
    a = Action(id=f"prepare/{stem}-{h}", kind="prepare", description=f"prepare {stem}",
               inputs={"model": str(g.model), **more}, outputs=outputs, params=params, watch=watch, **common_params(recipe))
    return path, a

def model_files(role: str, path: str) -> dict[str, str]:
    """A model ctxbuild writes comes with its external data file (`<model>.data`, see actions/prepare.py)."""
    return {role: path, f"{role}.data": path + ".data"}

def quantize_action(recipe: Recipe, g: Graph, prepared: str, work: Path, settings: dict[str, Any],
              reference: str | None = None, gate: str | None = None, search: bool = False) -> tuple[str, Action]:
    """`settings`: one of recipe.quantization (quantization.settings()); its name is a label, not a parameter.
    `reference`: the float model with LoRA slots as inputs (recipes with adapters). `gate`: a precision
    search's gate file (verify/gates.py): its own node, apart from the ungated one other recipes share.
    `search`: a precision search's candidate, which drops out where a plain build fails (actions/quantize.py)."""
    cal = g.calibration
    assert cal is not None  # recipe validation requires calibration for quantized precisions
    quant = {k: v for k, v in settings.items() if k not in ("name", "samples")}
    params = {"quantization": quant, "samples": settings["samples"] or cal.samples, "random": cal.random,
              "inputs": {k: list(v) for k, v in sorted(g.inputs.items())}}
    if g.outputs:  # the recipe's cut: a pin past it is named so (absent otherwise: existing keys stay)
        params["outputs"] = list(g.outputs)
    if g.input_values:  # as the cut: a pin in a branch the values drop is named so
        params["input_values"] = dict(sorted(g.input_values.items()))
    if search:
        params["search"] = True
    inputs = model_files("model", prepared)
    if recipe.adapters and reference:  # LoRA: calibrate over the declared adapter set (a change recompiles)
        params["adapters"], more = calibration_inputs(recipe.adapters)
        inputs.update(more, **model_files("reference", reference))
    if recipe.alpha and reference:  # switch: alpha: calibrate over the base and every adapter alone
        params["alpha"] = len(recipe.alpha.items)
        inputs.update(model_files("reference", reference))
    watch = [str(cal.dir)] if cal.dir else []  # its *contents* are keyed (discovered inputs), not its path
    if gate:
        inputs["gate"] = gate
    # Work paths relative to OUT's work dir: a copied or moved OUT plans the same ids (engine/owner.py)
    rel = [os.path.relpath(p, work) for p in (prepared, *([gate] if gate else []))]
    h = short_hash(["quantize", params, rel[0], watch] + rel[1:])
    stem = g.model.stem
    path = str(work / f"{stem}-{h}" / "quantized.onnx")
    a = Action(id=f"quantize/{stem}-{h}", kind="quantize",
               description=f"quantize {stem} ({describe(recipe.precision, settings)})",
               inputs=inputs, outputs=model_files("model", path), params=params, watch=watch,
               **common_params(recipe))
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

def compile_action(recipe: Recipe, b: Built, t: Target, d: Path, *, name: str | None = None,
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
        params["split_outputs"] = split_param(recipe.compile.split_outputs)
    # What the HTP's fp16 computes coarsely, rewritten at compile (graph/legalize FP16_RULES). Not for a bundle's
    # verification twins: the bundle compiles the prepared models as they are, and the twins must match it.
    if recipe.precision == "fp16" and not recipe.is_bundle:
        from ctxbuild.graph.legalize import fp16_rules

        if rules := fp16_rules(recipe.rewrite):
            params["fp16_rewrite"] = {"rules": rules, "code": source_digest(LEGALIZE_DIR)}
    if recipe.compile.quantized_io:
        params["quantized_io"] = True
    twin = " (verification twin)" if name else f" (candidate {candidate})" if candidate else ""
    ident = f"{stem}.{candidate}" if candidate else stem
    inputs = model_files("model", b.model)
    if recipe.adapters or recipe.alpha:  # the wrapper gets the slots' defaults from the float reference
        inputs.update(model_files("reference", b.reference))
    if recipe.alpha and precisions.quantized(recipe.precision) and not name and not recipe.compile.quantized_io:
        # switch: alpha: one binary with quantized I/O, two wrappers (lora/wrappers.py): ctx takes floats (its Q/DQ
        # run on the CPU EP), ctx_qio the codes
        params["quantized_io"] = True
        outputs["ctx_qio"] = str(d / f"{stem}_ctx_qio.onnx")
    return Action(id=f"compile/{ident}@{t.name}", kind="compile", description=f"compile {stem}@{t.name}{twin}",
                  inputs=inputs, outputs=outputs, params=params,
                  target=(action_target or t).as_dict(), pool="compile", **common_params(recipe))

def split_param(v: bool | tuple[str, ...]) -> bool | list[str]:
    return list(v) if isinstance(v, tuple) else v

def prebuilt_action(recipe: Recipe, t: Target, out: Path) -> Action:
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
                  inputs={"bin": str(pb.bin)}, outputs=outputs, params=params, target=t.as_dict(), **common_params(recipe))

def bundle_action(recipe: Recipe, built: list[Built], t: Target, out: Path) -> Action:
    d = out / t.name / recipe.name
    outputs = {f"ctx:{b.graph.name}": str(d / f"{b.graph.name}_ctx.onnx") for b in built}
    outputs["bin"] = str(d / f"{recipe.name}_qnn.bin")
    inputs = {k: v for b in built for k, v in model_files(f"model:{b.graph.name}", b.model).items()}
    inputs.update({k: v for b in built for k, v in model_files(f"reference:{b.graph.name}", b.reference).items()})
    params = {"provider_options": provider_options(recipe, t), "cpu_fallback": recipe.compile.cpu_fallback,
              "precision": recipe.precision, "graphs": [b.graph.name for b in built]}
    if precisions.quantized(recipe.precision):  # each graph had its own quantize action: the weights they share
        params["shared_weights"] = True  # must come out of them alike (bundle checks)
    if recipe.adapters:  # the wrappers get the slots' defaults from the float references
        params["adapters"] = True
    return Action(id=f"bundle/{recipe.name}@{t.name}", kind="bundle",
                  description=f"bundle {recipe.name}@{t.name} ({len(built)} graphs)", inputs=inputs,
                  outputs=outputs, params=params, target=t.as_dict(), pool="compile", **common_params(recipe))

def verify_action(recipe: Recipe, b: Built, t: Target, compiled: Action, out: Path, *, method: str,
            bundle: Action | None = None, artifact: Action | None = None, candidate: str | None = None) -> Action:
    """Verify `compiled` on the simulator. When the deliverable cannot run there (a bundle, a multi-SoC
    binary), `compiled` is its twin and the deliverable is an input too: re-verified whenever it changes.
    A search `candidate` only measures (no thresholds, never fails on accuracy): the select action judges."""
    graph = b.graph
    label = f"{recipe.name}.{graph.name}" if recipe.is_bundle else recipe.name
    min_cos, min_snr = thresholds(recipe)
    v = recipe.verify
    sampling, watch = verify_samples(recipe, graph)
    params = {"graph": graph.name, "method": method, "precision": recipe.precision,
              "thresholds": {"min_cosine": min_cos, "min_snr_db": min_snr},
              "samples": sampling["samples"], "timeout_s": v.get("timeout_s", 300),
              "sample_source": sampling["sample_source"],
              # switch: alpha: the float-I/O wrapper's Q/DQ run on the CPU EP (lora/wrappers.py)
              "cpu_fallback": recipe.compile.cpu_fallback or bool(recipe.alpha and "ctx_qio" in compiled.outputs),
              "inputs": sampling["inputs"], **{k: sampling[k] for k in ("outputs", "input_values") if k in sampling}}
    if recipe.compile.split_outputs:  # the wrapper's re-joining Concat runs on the CPU
        params["split_outputs"] = split_param(recipe.compile.split_outputs)
    if v.get("slices"):
        params["slices"] = v["slices"]
    inputs = {**model_files("reference", b.reference), **model_files("compiled", b.model),
              "original": str(graph.model),  # the user's model as given: what the simulator's outputs must match
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
                  params=params, target=t.as_dict(), watch=watch,
                  pool="compile", **common_params(recipe))

def verify_samples(recipe: Recipe, graph: Graph) -> tuple[dict[str, Any], list[str]]:
    """What a graph is verified on: (samples, sample_source and inputs params, the directory to watch)."""
    v = recipe.verify
    samples_dir = named_path(recipe.file.parent, v["dir"]) if v.get("dir") else (
        graph.calibration.dir if graph.calibration and graph.calibration.dir else None)
    params = {"samples": v.get("samples", 4),
              "sample_source": "verification" if v.get("dir") else ("calibration" if samples_dir else "random"),
              "inputs": {k: list(x) for k, x in sorted(graph.inputs.items())}}
    if graph.outputs:  # the reference is the user's model cut at the same tensors (verify/memo.py)
        params["outputs"] = list(graph.outputs)
    if graph.input_values:  # ... run with those inputs set to the values
        params["input_values"] = dict(sorted(graph.input_values.items()))
    return params, [str(samples_dir)] if samples_dir else []


def thresholds(recipe: Recipe) -> tuple[float, float]:
    """(min cosine, min SNR dB): the recipe's, else the defaults of its precision."""
    min_cos, min_snr = precisions.get(recipe.precision).thresholds or (0.0, 0.0)
    return recipe.verify.get("min_cosine", min_cos), recipe.verify.get("min_snr_db", min_snr)
