"""prepare: make the recipe's `input_values:` constants (graph/inputvalues.py), fix input shapes, inline the Ifs
those and the shapes decide, stamp an IR version onnxruntime reads, cut the model to the recipe's `outputs:`
(graph/cut.py), fold with ORT's basic optimizer (which inlines the Ifs shapes decide that ctxbuild could not
evaluate), reject the control flow left, legalize ops the HTP does not run (ctxbuild.graph.legalize: Einsum, GatherND, dynamic int8,
runtime Clip bounds, ...) and check the rewrites on samples: the model before and after them on the CPU EP, rule by rule when they
differ; a rule that moves the outputs is withdrawn, and the prepared model's metadata says which and why.

The output's weights always go to external data (`prepared.onnx.data`): models over the 2 GB protobuf
limit then flow like any other, and the weights are never loaded into Python memory here."""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ctxbuild.plan.action import Action
from ctxbuild.lora import alpha as lora_alpha
from ctxbuild.lora.adapters import add_defaults, make_slots
from ctxbuild.errors import ActionError, cause_line
from ctxbuild.graph import cut, inputvalues, nodenames
from ctxbuild.graph.modelio import data_path, external_data_files, graph_inputs, load, save_external, save_with_data
from ctxbuild.graph.samples import for_verification, input_spec, list_samples

if TYPE_CHECKING:  # imported where used: keying and summaries need no numpy
    import numpy as np

# Measured: onnxruntime 1.31 loads IR <= 13; onnx 1.23 writes 14 by default. Stamp down to what ORT reads.
ORT_MAX_IR_VERSION = 13
CONTROL_FLOW = ("If", "Loop", "Scan")
EXTERNAL_MIN_BYTES = 1024  # onnx's own default threshold for external data


def discover_inputs(action: Action) -> dict[str, Path]:
    """The model's external data, and the samples the rewrites are checked on when a rule may apply."""
    path = Path(action.inputs["model"])
    model = load(path, external_data=False)
    return external_data_files(model, path) | sample_files(action, model)


def sample_files(action: Action, model: Any) -> dict[str, Path]:
    """The recipe's samples (verify.dir, else calibration.dir), when the model has an op some rule in use looks
    at: a model no rule can touch does not re-prepare when its samples change."""
    from ctxbuild.graph.legalize import may_apply

    if not action.watch or not may_apply(model, _only(action.params)):
        return {}
    return list_samples(Path(action.watch[0]), action.params["check"]["samples"], action.recipe_files[0])


def _only(params: dict[str, Any]) -> list[str]:
    """The rules to run: those the recipe lists, else (`rewrite: true`) every rule the toolchain needs."""
    from ctxbuild.graph.legalize import RULES
    from ctxbuild.graph.legalize.toolchains import decide

    rules = params.get("rewrite", True)
    if rules is not True:
        return rules or []
    return [r.NAME for r in RULES if decide(r.NAME, _plugin(params))[0]]


def _plugin(params: dict[str, Any]) -> str:
    """The onnxruntime-qnn release this prepare runs for (its toolchain's, else the installed one)."""
    from ctxbuild.toolchain.choose import by_name
    from ctxbuild.toolchain.installed import version

    return by_name(params["toolchain"]).plugin if "toolchain" in params else version("onnxruntime-qnn")


def _rule_reasons(params: dict[str, Any], model: Any) -> dict[str, str]:
    """Per rule whose pattern the model has, whether it ran for this toolchain and why (the prepare record's
    `rules`); a recipe's own list of rules is its reason."""
    from ctxbuild.graph.legalize import RULES, wanted
    from ctxbuild.graph.legalize.toolchains import decide

    present = [r.NAME for r in RULES if wanted(model, [r.NAME])]
    if params.get("rewrite", True) is not True:
        chosen = params["rewrite"] or []
        return {rule: "named in prepare.rewrite" if rule in chosen else "not named in prepare.rewrite"
                for rule in present}
    return {rule: decide(rule, _plugin(params))[1] for rule in present}


def run(ctx: Any) -> None:
    import onnx

    src = Path(ctx.action.inputs["model"])
    model = load(src, external_data=False)
    if model.ir_version > onnx.IR_VERSION:
        raise ActionError(f"{src}: IR version {model.ir_version} is newer than this toolchain reads "
                          f"(onnx {onnx.__version__}: <= {onnx.IR_VERSION})",
                          "re-export with an older onnx, or upgrade onnx/onnxruntime")
    model.ir_version = min(model.ir_version, ORT_MAX_IR_VERSION)
    if values := ctx.action.params.get("input_values"):  # before the shapes: those inputs are no longer inputs
        _fix_values(ctx, model, src, values)
    _fix_shapes(model, src, ctx.action.params["inputs"], ctx.action.recipe_files[0])
    if any(n.op_type == "If" for n in model.graph.node):  # those the values and the fixed shapes decide
        if inlined := inputvalues.inline_decided(model):
            ctx.facts["inlined"] = inlined
    if outputs := ctx.action.params.get("outputs"):  # the recipe's `outputs:`: this part is the model from here on
        model = cut.extract(model, outputs)
    user = nodenames.outline(model)  # quantization.nodes speaks the user's names: those prepare changes recorded
    slots = ctx.action.params.get("adapter_slots")
    defaults: dict[str, Any] = {}
    if slots:  # LoRA: slots become graph inputs before folding (folding would rename or merge them)
        defaults = make_slots(model, slots["patterns"], slots["scaling"])
    if alpha := ctx.action.params.get("alpha"):  # switch: alpha: every adapter a branch gated by lora_alpha[i]
        alpha_map = _attach_alpha(ctx, model, alpha)
        defaults = {alpha["input"]: np_zeros(len(alpha["adapters"]))}
    dst = ctx.tmp_output("model")
    if ctx.action.params["optimize"]:
        try:
            _optimize(model, src, dst, ctx.tmp / "staged")
        except ActionError:  # onnxruntime failed folding an If (a nested one, 1.32): say what stays
            _refuse_control_flow(ctx, model, src)
            raise
    else:
        save_external(model, src.parent, dst)
    _refuse_control_flow(ctx, load(dst, external_data=False), src)  # after onnxruntime inlined the Ifs shapes decide
    steps = [user, nodenames.outline(load(dst, external_data=False))]  # the user's nodes, then each step's
    if ctx.action.params.get("rewrite", True):
        steps += _legalize(ctx, dst, lambda: _check_inputs(ctx, model, dst, defaults))
    steps.append(nodenames.outline(load(dst, external_data=False)))
    _stamp(dst, {nodenames.KEY: nodenames.renamed(steps), lora_alpha.KEY: alpha_map if alpha else None})
    if alpha:
        _kept_weights(load(dst, external_data=False), alpha_map, src)
    if slots or alpha:  # the float reference: the same graph with the defaults as overridable initializers
        reference = onnx.load(str(dst))
        add_defaults(reference, defaults)
        save_with_data(reference, ctx.tmp_output("reference"))


def _attach_alpha(ctx: Any, model: Any, alpha: dict[str, Any]) -> dict[str, Any]:
    files = {a["name"]: Path(ctx.action.inputs[f"alpha:{a['name']}"]) for a in alpha["adapters"]}
    return lora_alpha.attach(model, alpha, files)


def np_zeros(n: int) -> Any:
    import numpy as np

    return np.zeros(n, np.float32)


def _kept_weights(model: Any, alpha_map: dict[str, Any], src: Path) -> None:
    """The verification merges each adapter into its targets' weights: they must survive the optimizer by name."""
    inits = {t.name for t in model.graph.initializer}
    lost = sorted({t["weight"] for a in alpha_map["adapters"] for t in a["targets"]} - inits)
    if lost:
        raise ActionError(f"{src}: onnxruntime's optimizer folded the adapted weight(s) {', '.join(lost)}",
                          "adapt nodes whose weights are plain initializers")


def _fix_values(ctx: Any, model: Any, src: Path, values: dict[str, Any]) -> None:
    """The recipe's `input_values:` made constants (graph/inputvalues.py)."""
    try:
        inputvalues.fix(model, values)
    except ValueError as e:  # checked when planning: the model changed since
        raise ActionError(f"{ctx.action.recipe_files[0]}: input_values: {e} ({src.name})",
                          "fix input_values to the model's inputs (names, dtypes and shapes as Netron shows them)"
                          ) from None


def _refuse_control_flow(ctx: Any, model: Any, src: Path) -> None:
    """QNN runs no If/Loop/Scan: one line naming them, with the recipe line that gets past them (graph/cut.py):
    the input an If's branch follows fixed by `input_values:`, else the static part built alone by `outputs:`."""
    flow = [f"'{nodenames.key(n) or '?'}' ({n.op_type})" for n in model.graph.node if n.op_type in CONTROL_FLOW]
    if flow:
        seen = _sample_values(ctx.action, model)
        raise ActionError(f"{src}: control flow is not supported on QNN: node {', '.join(flow[:5])}",
                          cut.split_line(model, set(CONTROL_FLOW), seen=seen) or
                          "export the model without If/Loop/Scan (unroll, or split it into graphs)")


def _sample_values(action: Action, model: Any) -> dict[str, Any]:
    """The value each small input (graph/inputvalues.settings_of) has in every one of the recipe's samples that
    holds it, where they agree: what a hint's `input_values:` line can give."""
    import numpy as np

    from ctxbuild.graph.samples import read_arrays

    small = inputvalues.settings_of(model)
    if not small or not action.watch or not Path(action.watch[0]).is_dir():
        return {}
    found: dict[str, set[str]] = {}
    for path in sorted(Path(action.watch[0]).glob("*.npz"))[:16]:
        try:
            arrays = read_arrays(path, "sample")
        except ActionError:
            continue  # the sample's own check says what is wrong with it, when it is read for real
        for name in small.keys() & arrays.keys():
            found.setdefault(name, set()).add(json.dumps(np.asarray(arrays[name]).tolist()))
    return {name: json.loads(next(iter(v))) for name, v in found.items() if len(v) == 1}


def _fix_shapes(model: Any, src: Path, shapes: dict[str, list[int]], recipe: str) -> None:
    inputs = graph_inputs(model)
    names = [i.name for i in inputs]
    for name in shapes:
        if name not in names:
            raise ActionError(f"{recipe}: inputs: '{name}' is not an input of {src.name}",
                              f"the model's inputs are: {', '.join(names)}")
    for inp in inputs:
        dims = inp.type.tensor_type.shape.dim
        want = shapes.get(inp.name)
        if want is not None:
            if len(want) != len(dims):
                raise ActionError(f"{recipe}: inputs: '{inp.name}' has rank {len(dims)} in {src.name}, "
                                  f"the recipe gives {len(want)} dims {want}")
            for i, (d, w) in enumerate(zip(dims, want)):
                # a negative dim_value is how some exporters write "dynamic"; onnxruntime reads it so too
                if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != w:
                    raise ActionError(f"{recipe}: inputs: '{inp.name}' dim {i} is fixed to {d.dim_value} in "
                                      f"{src.name}, the recipe asks for {w}")
                d.Clear()
                d.dim_value = w  # per index: make_input_shape_fixed fails when two dims share a name
            continue
        for i, d in enumerate(dims):
            if not d.HasField("dim_value") or d.dim_value <= 0:
                label = f"'{d.dim_param}'" if d.dim_param else (
                    f"dim_value {d.dim_value}" if d.HasField("dim_value") else "unnamed")
                raise ActionError(f"{recipe}: input '{inp.name}' dim {i} ({label}) of {src.name} is dynamic; "
                                  "QNN needs fixed shapes",
                                  f"add inputs: {{{inp.name}: [{', '.join(str(max(x.dim_value, 1)) for x in dims)}]}} "
                                  "(1 where the model leaves a dim open: use your real size)")


def summarize(action: Action) -> dict[str, Any]:
    """The rewrites legalization made, the rules the sample check withdrew and the patterns left as written
    (each absent when none), from the prepared model's metadata."""
    from ctxbuild.graph.legalize import KEPT_KEY, METADATA_KEY, WITHDRAWN_KEY

    props = {p.key: p.value for p in load(Path(action.outputs["model"]), external_data=False).metadata_props}
    return {field: json.loads(props[key]) for field, key in (("rewrites", METADATA_KEY), ("withdrawn", WITHDRAWN_KEY),
                                                             ("kept", KEPT_KEY)) if key in props}


def _legalize(ctx: Any, dst: Path, inputs: Callable[[], tuple[list[dict[str, np.ndarray]], str]]
              ) -> list[list[nodenames.Outline]]:
    """Rewrite what the HTP cannot run (rules in ctxbuild.graph.legalize), then check the rewrites on `inputs`;
    the weights are loaded only when a rule's op is present. dst keeps the folded model when no rewrite is kept
    (its metadata then says why). Returns the nodes after each rule of the rewrite kept (graph/nodenames.py)."""
    from ctxbuild.graph.legalize import KEPT_KEY, SPLIT_KEY, WITHDRAWN_KEY, wanted

    optimize, only = ctx.action.params["optimize"], _only(ctx.action.params)
    folded = load(dst, external_data=False)
    if reasons := _rule_reasons(ctx.action.params, folded):
        ctx.facts["rules"] = reasons
    if not wanted(folded, only):
        return []
    first = _rewritten(dst, ctx.tmp / "rewritten", optimize, only)
    if not first.rewrites:
        if first.kept:
            _stamp(dst, {KEPT_KEY: first.kept})
        return []
    start = time.monotonic()
    chosen, withdrawn, facts = _checked(ctx, dst, first, *inputs())
    ctx.facts["rewrite_check"] = {"seconds": round(time.monotonic() - start, 3), **facts}
    if chosen is not None:
        for f in (chosen.path, data_path(chosen.path)):
            os.replace(f, dst.parent / f.name)
    _stamp(dst, {KEPT_KEY: first.kept, WITHDRAWN_KEY: withdrawn, SPLIT_KEY: facts.get("split")})
    return chosen.steps if chosen is not None else []


def _checked(ctx: Any, dst: Path, first: Candidate, samples: list[dict[str, np.ndarray]], on: str
             ) -> tuple[Candidate | None, dict[str, str], dict[str, Any]]:
    """The rewritten model to keep (None: none), why each withdrawn rule was, and what the check measured (for
    the record), on `samples` (`on` says what they are). All rules at once first, at the tightest tolerance among
    them; when that fails, rule by rule, each against the model with the rules kept before it (so each is
    measured alone, at its own tolerance, or its minimum SNR; the last step reuses the first model when nothing
    was withdrawn)."""
    from ctxbuild.graph.legalize.check import min_snr_db, moved, snr_db, tolerance
    from ctxbuild.verify.measure import cpu_outputs

    facts: dict[str, Any] = {"models_run": 0, "moved": {}}

    def run(model: Path) -> dict[str, np.ndarray] | str:
        facts["models_run"] += 1
        try:
            return cpu_outputs(model, samples, qdq_as_written=True)  # the rewrites keep the model's own math
        except MemoryError:
            raise
        except ActionError as e:  # the sizes follow the data: the compile's refusal gives this line
            if e.hint and "`outputs: [" in e.hint:
                facts["split"] = e.hint
            return f"onnxruntime's CPU EP could not run it ({cause_line(e, limit=200)})"
        except Exception as e:  # noqa: BLE001 - onnxruntime's (and the shape check's) errors: the reason recorded
            first_line = cause_line(e, limit=200)
            return f"onnxruntime's CPU EP could not run it ({first_line})"

    def why(label: str, reference: dict[str, np.ndarray], after: dict[str, np.ndarray] | str, tol: float
            ) -> str | None:
        if isinstance(after, str):
            return f"the rewritten model: {after}"
        worst, what = moved(reference, after)
        facts["moved"][label] = float(f"{worst:.3g}") if worst < float("inf") else None  # JSON has no inf
        if (floor := min_snr_db(label) if label in first.rewrites else None) is not None:
            snr, what = snr_db(reference, after)
            facts.setdefault("snr_db", {})[label] = round(snr, 1) if abs(snr) < float("inf") else None
            return None if snr >= floor else f"{what} (minimum {floor:g} dB) {on}"
        return None if worst <= tol else f"{what} (tolerance {tol:g}) {on}"

    before = run(dst)
    if isinstance(before, str):
        return None, {rule: f"not checked: the model before the rewrites: {before}" for rule in first.rewrites}, facts
    first_after = run(first.path)
    label = next(iter(first.rewrites)) if len(first.rewrites) == 1 else "all rules"  # one rule: its own measure
    if (found := why(label, before, first_after, min(map(tolerance, first.rewrites)))) is None:
        return first, {}, facts
    if len(first.rewrites) == 1:
        return None, {rule: found for rule in first.rewrites}, facts
    kept: Candidate | None = None
    reference, withdrawn = before, {}
    for rule in first.rewrites:
        rules = (list(kept.rewrites) if kept else []) + [rule]
        if rules == list(first.rewrites):
            trial, after = first, first_after
        else:
            trial = _rewritten(dst, ctx.tmp / f"rewritten-{rule}", ctx.action.params["optimize"], rules)
            if rule not in trial.rewrites:  # it rewrote only what a withdrawn rule made
                continue
            after = run(trial.path)
        if (found := why(rule, reference, after, tolerance(rule))) is None:
            kept, reference = trial, after  # type: ignore[assignment]
        else:
            withdrawn[rule] = found
    return kept, withdrawn, facts


@dataclass
class Candidate:
    """A rewritten model written out, what made it, and what its rules left as written."""

    path: Path
    rewrites: dict[str, int]
    kept: dict[str, list[str]]
    steps: list[list[nodenames.Outline]]  # the nodes after each rule that rewrote


def _rewritten(dst: Path, d: Path, optimize: bool, only: list[str]) -> Candidate:
    """dst rewritten by the rules `only` into `d`/<dst's name> (+ data), optimized again after a
    rewrite (the optimizer folds the Transposes of weights); nothing is written when no rule rewrote."""
    from ctxbuild.graph.legalize import METADATA_KEY, legalize

    model = load(dst)
    done = legalize(model, only)
    path = d / dst.name
    if done.rewrites:
        _set_props(model, {METADATA_KEY: done.rewrites})
        d.mkdir()
        if optimize:
            legal = d / "legal" / "legal.onnx"
            legal.parent.mkdir()
            save_with_data(model, legal)
            del model
            _optimize(load(legal, external_data=False), legal, path, d / "restaged")
            shutil.rmtree(legal.parent)
        else:
            save_with_data(model, path)
    return Candidate(path, done.rewrites, done.kept, done.steps)


def _stamp(path: Path, props: dict[str, Any]) -> None:
    """Add the non-empty `props` to the model's metadata (JSON values); only the proto is rewritten."""
    import onnx

    if props := {k: v for k, v in props.items() if v}:
        model = load(path, external_data=False)
        _set_props(model, props)
        onnx.save(model, str(path))


def _set_props(model: Any, props: dict[str, Any]) -> None:
    import onnx

    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                        **{k: json.dumps(v) for k, v in props.items()}})


def _check_inputs(ctx: Any, model: Any, dst: Path, fixed: dict[str, np.ndarray]
                  ) -> tuple[list[dict[str, np.ndarray]], str]:
    """What the rewrites are checked on, and what that is ("on 2 verification samples"): the samples discovered
    (seeded random inputs when there are none, or when the user's model had no op a rule looks at and something
    folded became one), with the LoRA slots at their defaults."""
    check = ctx.action.params["check"]
    spec = {k: v for k, v in input_spec(load(dst, external_data=False)).items() if k not in fixed}
    files = sample_files(ctx.action, model)
    params = check if files else {**check, "sample_source": "random"}
    samples = [s | fixed for s in for_verification(spec, params, lambda: files, ctx.action.recipe_files[0],
                                                   inputvalues.recorded(model))]
    what = f"{params['sample_source']} samples" if files else "seeded random inputs"
    return samples, f"on {len(samples)} {what}"


def _optimize(model: Any, src: Path, dst: Path, stage: Path) -> None:
    """ORT_ENABLE_BASIC folds BatchNorm into Conv and constants: float BatchNorm does not run on HTP.
    ORT reads the weights from the source's external data (linked beside the staged proto) and writes
    every initializer of EXTERNAL_MIN_BYTES or more to `prepared.onnx.data`."""
    import onnx
    import onnxruntime as ort

    from ctxbuild.qnn.staging import link_data

    staged = stage / "staged.onnx"
    staged.parent.mkdir()
    link_data(src, staged.parent)
    onnx.save(model, str(staged))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(dst)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_path(dst).name)
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                str(EXTERNAL_MIN_BYTES))
    try:
        ort.InferenceSession(str(staged), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises its own untyped errors for invalid models
        free = shutil.disk_usage(dst.parent).free
        if free < model.ByteSize():  # ORT reports a write that ran out of space as INVALID_PROTOBUF
            raise ActionError(f"no space left to write the prepared model under {dst.parent} ({free:,} bytes free, "
                              f"it needs about {model.ByteSize():,})", "free disk space where OUT is") from None
        raise ActionError(f"onnxruntime rejected the model: {cause_line(e)}") from None
    data_path(dst).touch()  # ORT writes no data file when no initializer is that big; the plan declares one
