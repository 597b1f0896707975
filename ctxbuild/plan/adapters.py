"""Planning LoRA adapters: per adapter x graph x target, an `adapter` action writing the `.onnx_adapter` that
binds it to the compiled wrapper, and a `verify_adapter` action running it on the simulator.

Neither feeds the compile: an adapter outside the calibration set (added or changed) re-runs only these.
The calibration set's files are inputs of the quantize action (see plan._quantize), so changing the set
re-quantizes and recompiles.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild.recipes.objects import Recipe
from ctxbuild.recipes.adapters import GROUPED, Adapter, Adapters
from ctxbuild.recipes.targets import Target


def adapter_param(adapters: Adapters, a: Adapter) -> dict[str, Any]:
    # The suffix picks the file's reader (lora/adapters.read_file): the same bytes under another name read
    # differently or not at all, so it is keyed like the bytes are.
    return {"format": a.file.suffix, "tensors": dict(a.tensors), "scale": a.scale, "scaling": adapters.scaling}


def calibration_inputs(adapters: Adapters) -> tuple[dict[str, Any], dict[str, str]]:
    """(quantize params, quantize inputs) for calibrating over the declared adapter set."""
    cal = adapters.calibration_set()
    return ({a.name: adapter_param(adapters, a) for a in cal}, {f"adapter:{a.name}": str(a.file) for a in cal})


def adapter_actions(recipe: Recipe, graph: str, t: Target, deliverable: Action, base_verify: Action | None,
                    out: Path) -> list[Action]:
    """`deliverable`: the compile or bundle writing the graph's wrapper; `base_verify`: the graph's plain
    verify (no adapter; None when verification is off), the template of each adapter's verification: it
    runs the same wrapper (or, for a bundle, the graph's single-graph twin) with the adapter bound."""
    adapters = recipe.adapters
    assert adapters is not None
    bundle = deliverable.kind == "bundle"
    role = f"ctx:{graph}" if bundle else "ctx"
    d = out / t.name / recipe.name / "adapters"
    label = f"{recipe.name}.{graph}" if bundle else recipe.name
    stem = (lambda name: f"{graph}.{name}") if bundle else (lambda name: name)
    acts = []
    for a in adapters.items:
        inputs = {"adapter": str(a.file), "ctx": deliverable.outputs[role]}
        if bundle:  # a file may hold slots of the bundle's other graphs: check it against all of them
            inputs.update({f"peer:{r}": p for r, p in deliverable.outputs.items() if r.startswith("ctx:") and r != role})
        binding = Action(id=f"adapter/{label}+{a.name}@{t.name}", kind="adapter",
                         description=f"adapter {a.name} for {label}@{t.name}", inputs=inputs,
                         outputs={"binding": str(d / f"{stem(a.name)}.onnx_adapter")},
                         params={"name": a.name, "graph": graph, **adapter_param(adapters, a)},
                         target=t.as_dict(), recipes=[recipe.name], recipe_files=[str(recipe.file)], toolchain=recipe.toolchain)
        acts.append(binding)
        if base_verify is not None:
            v = _verify_adapter(base_verify, binding, a.name, a.name in adapters.calibrate,
                                d / f"{stem(a.name)}_verify.json", label, t.name)
            if recipe.compile.quantized_io:  # the binding holds quantized values: the reference binds the file
                v.inputs["adapter"] = str(a.file)
                v.params["bind"] = adapter_param(adapters, a)
            acts.append(v)
    return acts


def _verify_adapter(base: Action, binding: Action, name: str, calibrated: bool, result: Path, label: str,
                    target: str) -> Action:
    """The graph's verify action with the adapter bound: same samples, metrics and thresholds."""
    v = copy.deepcopy(base)
    v.id = f"verify_adapter/{label}+{name}@{target}"
    v.kind = "verify_adapter"
    v.description = f"verify {label} with adapter {name}@{target}"
    v.params.update(adapter=name, calibrated=calibrated)
    v.inputs["binding"] = binding.outputs["binding"]
    v.outputs = {"result": str(result)}
    return v


def alpha_verify_action(recipe: Recipe, base_verify: Action, compiled: Action) -> Action:
    """switch: alpha: the graph's verification per alpha vector (actions/verify_alpha.py), beside the plain verify
    (lora_alpha not fed: its default, all zeros). Reads the adapter files: a changed one re-verifies (and, through
    prepare, rebuilds)."""
    assert recipe.alpha is not None
    v = copy.deepcopy(base_verify)
    v.id = base_verify.id.replace("verify/", "verify_alpha/", 1)
    v.kind = "verify_alpha"
    v.description = f"verify {recipe.name}@{compiled.target['name']} per lora_alpha ({len(recipe.alpha.items)} adapters)"
    v.params["alpha"] = recipe.alpha.param()
    v.inputs.update(recipe.alpha.files())
    v.inputs.update({f"ctx.{k}": p for k, p in compiled.outputs.items()})
    result = Path(base_verify.outputs["result"])
    v.outputs = {"result": str(result.with_name(f"{recipe.name}_verify_alpha.json"))}
    return v


def section_actions(recipe: Recipe, t: Target, out: Path) -> list[Action]:
    """A prebuilt binary's LoRAv2 sections for one target: copied beside the wrapper, one lora_config each."""
    pb = recipe.prebuilt
    if pb is None or pb.sections is None:
        return []
    d = out / t.name / recipe.name
    names = [n for n, _ in pb.sections.files]
    outputs = {}
    for n, f in pb.sections.files:
        outputs[f"section:{n}"] = str(d / "adapters" / f"{n}{f.suffix or '.bin'}")
        outputs[f"config:{n}"] = str(d / f"{n}.lora_config")
    return [Action(id=f"lora_sections/{recipe.name}@{t.name}", kind="lora_sections",
                   description=f"LoRAv2 sections {recipe.name}@{t.name}",
                   inputs={"bin": str(pb.bin), **{f"section:{n}": str(f) for n, f in pb.sections.files}},
                   outputs=outputs, params={"names": names, "sdk_mismatch": pb.sections.sdk_mismatch,
                                            "soc_model": t.soc_model, "htp_arch": t.htp_arch},
                   target=t.as_dict(), recipes=[recipe.name], recipe_files=[str(recipe.file)], toolchain=recipe.toolchain)]


def adapter_rows(actions: list[Action], successors: Any) -> list[dict[str, Any]]:
    """Per adapter and target, what the manifest lists (plan.json "adapters"): its action, files, verifier."""
    rows = []
    for a in actions:
        if a.kind == "adapter":
            rows.append({"action": a.id, "recipe": a.recipes[0], "target": a.target, "name": a.params["name"],
                         "kind": "onnx_adapter", "graph": a.params["graph"], "files": [a.outputs["binding"]],
                         "verified_by": [v for v in successors(a.id) if v.startswith(("verify_adapter/", "llm_eval/"))]})
        elif a.kind == "lora_sections":  # grouped LoRA: one row, its sections and configs in the order applied
            groups: dict[str, list[str]] = {}
            for n in a.params["names"]:
                groups.setdefault(n.rsplit(".", 1)[0] if n.rsplit(".", 1)[-1] in GROUPED else n, []).append(n)
            rows += [{"action": a.id, "recipe": a.recipes[0], "target": a.target, "name": name,
                      "kind": "lora_v2_section", "graph": None, "sections": keys,
                      "files": [a.outputs[f"section:{k}"] for k in keys] + [a.outputs[f"config:{k}"] for k in keys],
                      "verified_by": []} for name, keys in groups.items()]
    return rows
