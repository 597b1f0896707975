"""verify: run the compiled `_ctx.onnx` on the HTP simulator and the float model on the CPU EP, compare
(ctxbuild/verify/measure.py has the runs and the metrics). The simulator runs in a forked child with a timeout: a crash or hang in the QNN library fails this
action with a clear line, never the worker, ninja or the driver.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxbuild.verify import slices as output_slices
from ctxbuild.plan.action import Action
from ctxbuild.errors import ActionError
from ctxbuild.actions.compile import compile_refusal
from ctxbuild.graph.cut import split_line
from ctxbuild.graph.inputvalues import apply, recorded
from ctxbuild.graph.modelio import external_data_files, load
from ctxbuild.graph.samples import cast_warnings, for_verification, input_spec, list_samples
from ctxbuild.verify.memo import OutputsMemo, float_reference, wrapper_identity
from ctxbuild.verify import gates, sample_workers
from ctxbuild.plan import memory
from ctxbuild.verify.early_stop import EarlyStop
from ctxbuild.verify.ladder import stuck_ops
from ctxbuild.verify.measure import compare, failures, metrics, simulate

if TYPE_CHECKING:  # imported where used: the cache-hit path (listing samples, warnings) needs no numpy
    import numpy as np


def discover_inputs(action: Action) -> dict[str, Path]:
    """The samples, and the external data of the user's model (the reference the outputs are compared with)."""
    original = Path(action.inputs["original"])
    return sample_files(action) | {f"original.{k}": p for k, p in
                                   external_data_files(load(original, external_data=False), original).items()}


def sample_files(action: Action) -> dict[str, Path]:
    """The sample files in the recipe's verification (or calibration) directory."""
    if not action.watch:
        return {}
    return list_samples(Path(action.watch[0]), action.params["samples"], action.recipe_files[0])


def warnings(action: Action) -> list[str]:
    if action.params["sample_source"] == "random":
        return [f"{action.description}: no verification or calibration samples; verifying on seeded random "
                "data (set verify.dir to real inputs)"]
    given = len(sample_files(action))
    if action.watch and given < action.params["samples"]:  # a verification on fewer samples than asked says so
        return [f"{action.description}: verified on {given} sample(s), fewer than the {action.params['samples']} "
                f"asked for ({action.watch[0]} holds {given}; verify.samples)"]
    return []


def summarize(action: Action) -> dict[str, Any]:
    """The result; and samples stored in another dtype than the model takes, which quantize has not said already
    (verification samples of their own, or a float build's)."""
    found = {"result": json.loads(Path(action.outputs["result"]).read_text())}
    p = action.params
    if not gates.is_skipped(found["result"]) and action.watch and (
            p["sample_source"] == "verification" or p.get("precision") == "fp16"):
        spec = input_spec(load(Path(action.inputs["reference"]), external_data=False))
        if casts := cast_warnings(action.description, list(sample_files(action).values()), spec):
            found["warnings"] = casts
    return found


def _user_model(a: Action) -> Any:
    """The user's model (no external data), its `input_values:` made constants and the Ifs they decide inlined:
    where the split hint looks for the nodes QNN refused."""
    model = load(Path(a.inputs["original"]), external_data=False)
    if values := a.params.get("input_values"):
        apply(model, values)
    return model


def run(ctx: Any) -> None:
    a = ctx.action
    p = a.params
    if gates.closed(a.inputs):
        gates.write_skipped(ctx)
        return
    if refused := compile_refusal({k.removeprefix("ctx."): v for k, v in a.inputs.items() if k.startswith("ctx.")}):
        if (stuck := stuck_ops(refused)) and (line := split_line(_user_model(a), stuck)):
            refused = {**refused, "split": line}  # no rung helps: the part before those nodes, as the user's model has it
        result = {"graph": p["graph"], "method": p["method"], "outputs": {}, "compile_refused": refused}
        Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
        return  # a search candidate QNN would not compile: nothing to measure, the select action says so
    ref_model = Path(a.inputs["reference"])
    ref_proto = load(ref_model, external_data=False)
    spec = input_spec(ref_proto)
    samples = for_verification(spec, p, lambda: sample_files(a), a.recipe_files[0], recorded(ref_proto))
    # What the memoized outputs depend on: content digests the runner already computed for the action key.
    key = ctx.key_components
    inputs = key["inputs"]
    memo = OutputsMemo(ctx.cache, ctx.tmp)
    start = time.monotonic()
    reference, sample_id = float_reference(ctx, samples, memo)
    ctx.facts["reference_seconds"] = round(time.monotonic() - start, 3)
    start = time.monotonic()
    timing: dict[str, float] = {}
    # A search candidate stops once its samples prove it fails (early_stop.py); the thresholds are in its key.
    stop = EarlyStop(reference, len(samples), **p["early_stop"],
                     slices=output_slices.stop_parts(ref_proto, p.get("slices"), reference)) if p.get("early_stop") else None
    # split_outputs: the wrapper re-joins the parts with a Concat on the CPU.
    cpu_fallback = p["cpu_fallback"] or bool(p.get("split_outputs"))

    def run_simulator() -> dict[str, np.ndarray]:
        # Idle cores run slices of the samples side by side (a search candidate's early stop needs them in order).
        workers = 1 if stop is not None else sample_workers.count(len(samples), memory.estimate(a))
        ctx.facts["simulator_workers"] = workers
        return simulate(Path(a.inputs["ctx.ctx"]), samples, cpu_fallback=cpu_fallback, timeout=p["timeout_s"],
                        timing=timing, stop=stop, workers=workers)

    got = memo.get_or_compute(
        "simulator", [wrapper_identity(Path(a.inputs["ctx.ctx"])), inputs.get("ctx.bin"), sample_id,
                      cpu_fallback, key["toolchain"]],
        run_simulator, complete=lambda: stop is None or stop.proof is None)
    # Timings go to the record, not the result file: the file must be the same bytes on every run.
    ctx.facts["simulator_seconds"] = round(time.monotonic() - start, 3)
    ctx.facts.update({f"simulator_{k}_seconds": round(v, 3) for k, v in timing.items()})
    ctx.facts.update(memo_hits=memo.hits, memo_keys=memo.keys)
    run = stop.samples_run if stop is not None and stop.proof else len(samples)
    if run < len(samples):  # stopped early: the figures are over the samples that ran
        reference = {n: r[:len(got[n])] for n, r in reference.items()}
    result: dict[str, Any] = {
        "graph": p["graph"], "method": p["method"], "samples": run, "sample_source": p["sample_source"],
        "reference": ctx.facts["reference"],
        "outputs": compare(reference, got, Path(a.inputs["original"])),
        "coverage": coverage(Path(a.inputs["ctx.ctx"]), Path(a.inputs["compiled"])),
    }
    output_slices.annotate(result["outputs"], ref_proto, p.get("slices"), reference, got, metrics)
    if stop is not None and stop.proof:
        result["early_stop"] = stop.record(len(samples))
    if "bundle.ctx" in a.inputs:
        result["bundle_signature_match"] = _same_signature(Path(a.inputs["bundle.ctx"]), Path(a.inputs["ctx.ctx"]))
    if not p.get("gate", True):  # a search candidate: measured here, judged by the select action
        Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
        return
    result["thresholds"] = p["thresholds"]
    found = failures(result)
    result["passed"] = not found
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    if found:
        raise ActionError(f"{p['graph']}@{a.target['name']}: " + "; ".join(found), details=result,
                          hint=_hint(a, ref_model, samples, reference, result))


# Measured on a T5 encoder (docs/legalization.md): rounding only the 16 DynamicQuantizeLinear inputs to fp16, on
# the CPU EP, gives cosine 0.94-0.95, as the fallback build does on the simulator.
DYNAMIC_ON_CPU = ("onnxruntime's per-run int8 quantization (DynamicQuantizeLinear) runs on the CPU between NPU "
                  "partitions: it rounds each activation to a step set by the run's range, so the fp16 rounding of "
                  "the partition before it flips whole steps")
DYNAMIC_REWRITE = ("; let prepare rewrite it (the dynamic_int8 rule, on by default in prepare.rewrite): the graph then "
                   "compiles whole")
DYNAMIC_WITHDRAWN = ("; prepare's dynamic_int8 rule, which makes the graph float, was withdrawn by the sample check "
                     "({why}): the HTP cannot compute this export as given: point the recipe's `model:` at the float "
                     "model it was quantized from")


def _hint(a: Action, ref_model: Path, samples: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray],
          result: dict[str, Any]) -> str:
    """Where the accuracy went (quantization or the HTP) and the likely fix: verify/advice.py, CPU side only."""
    import onnx

    from ctxbuild.graph.legalize import withdrawn  # its rules import numpy: not on the restore path
    from ctxbuild.verify.advice import failure_hint

    wrapper = onnx.load(a.inputs["ctx.ctx"], load_external_data=False)
    if any(n.op_type == "DynamicQuantizeLinear" for n in wrapper.graph.node):
        why = withdrawn(onnx.load(a.inputs["compiled"], load_external_data=False)).get("dynamic_int8")
        return DYNAMIC_ON_CPU + (DYNAMIC_WITHDRAWN.format(why=why) if why else DYNAMIC_REWRITE)
    split = any(n.name.endswith("__rejoin") for n in wrapper.graph.node)  # compiled with split_outputs already
    return failure_hint(ref_model, Path(a.inputs["compiled"]), samples, reference, result,
                        recipe=a.recipes[0], precision=a.params["precision"], split=split)


def coverage(ctx_model: Path, compiled: Path) -> dict[str, Any]:
    """Nodes that ran on QNN vs stayed on the CPU: nodes of the compiled model not absorbed into EPContext; with
    some on the CPU, the NPU partitions and the CPU's share of the model's MACs (qnn/fallback.py)."""
    import onnx

    from ctxbuild.qnn.fallback import of_wrapper

    wrapper = onnx.load(str(ctx_model), load_external_data=False)
    model = load(compiled, external_data=False)
    cpu = sum(1 for n in wrapper.graph.node if n.op_type != "EPContext")
    total = len(model.graph.node)
    qnn = max(total - cpu, 0)
    found = {"qnn_nodes": qnn, "cpu_nodes": cpu, "fraction": round(qnn / total, 4) if total else 1.0}
    if cpu:  # what ran on the CPU, as a share of the counted compute, and the nodes whose MACs are unknown
        cost = of_wrapper(model, wrapper)
        found |= {**cost.as_dict(), "cpu_nodes": cpu,
                  "cpu_macs_share": round(cost.cpu_macs / cost.total_macs, 4) if cost.total_macs else None}
    return found


def _same_signature(bundle_ctx: Path, single_ctx: Path) -> bool:
    """The bundle's copy of a graph must have the I/O of the single-graph build that was verified."""
    from ctxbuild.qnn.contextbin import describe

    def signature(ctx_path: Path) -> list[Any]:
        info = describe(ctx_path)
        part = _partition(ctx_path)
        graphs = [g for b in info["binaries"] for g in b["graphs"]]
        graph = next((g for g in graphs if g["name"] == part), None)
        if graph is None:
            raise ActionError(f"{ctx_path.name}: graph '{part}' not found in its context binary")
        # A bundle's binary names I/O `<graph>__<name>` (see actions/bundle.py); compare the names users see.
        return [[(t["name"].split("__", 1)[-1], t["dtype"], t["dims"]) for t in graph[k]] for k in ("inputs", "outputs")]

    return signature(bundle_ctx) == signature(single_ctx)


def _partition(ctx_path: Path) -> str:
    import onnx

    model = onnx.load(str(ctx_path), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "EPContext")
    return next(a.s.decode() for a in node.attribute if a.name == "partition_name")
