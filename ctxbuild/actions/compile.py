"""compile: ModelCompiler with the QNN plugin EP -> `<recipe>_ctx.onnx` (+ `_ctx_qnn.bin` unless embedded).

A precision search's candidate also writes `compile_status.json`. When QNN refuses to compile it (nodes it
cannot run at that quantization, a device configuration), the action succeeds with the refusal in its status
and empty placeholders for the model files, which nothing but the search reads: the candidate drops out and
the select action judges the others. The refusal is cached like any result (same inputs and compiler, same
refusal); anything else (out of memory, a crash, an interrupt) still fails the action and is not cached.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild.lora.adapters import add_wrapper_defaults
from ctxbuild.lora.wrappers import carry_alpha_map, float_io_wrapper
from ctxbuild.errors import ActionError
from ctxbuild.graph.protowire import wrapper_facts
from ctxbuild.qnn.staging import fixed_dir, link_model, stage_name
from ctxbuild.qnn import fallback, soccheck
from ctxbuild.qnn.compile import QnnCompileFailed, compile_error, compile_graph, trace_dir
from ctxbuild.verify import gates

def summarize(action: Action) -> dict[str, Any]:
    """Graph names as the binary holds them (loaders such as qnn.lora_config need them)."""
    if skipped(action.outputs):
        return {"graph_names": {}, "skipped": True}
    if refused := compile_refusal(action.outputs):
        return {"graph_names": {}, "compile_refused": refused}
    return {"graph_names": partition_names(action)}


def check_outputs(action: Action, outputs: dict[str, Path]) -> None:
    """The hook: the binary's SoC is the target's (a refused or skipped candidate has no binary)."""
    if not skipped(outputs) and compile_refusal(outputs) is None:
        soccheck.check_outputs(action, outputs)


def compile_refusal(outputs: dict[str, Any]) -> dict[str, Any] | None:
    """A search candidate's recorded refusal ({"error", "hint"}), or None (compiled, or not a candidate)."""
    if "status" not in outputs:
        return None
    status = json.loads(Path(outputs["status"]).read_text())
    return None if status.get("compiled", True) else status


def skipped(outputs: dict[str, Any]) -> bool:
    """A search candidate the search did not need (its gate was closed): placeholders only."""
    return "status" in outputs and gates.is_skipped(json.loads(Path(outputs["status"]).read_text()))


def run(ctx: Any) -> None:
    a = ctx.action
    if gates.closed(a.inputs):
        gates.write_skipped(ctx)
        return
    dst = ctx.tmp_output("ctx")
    src, options = Path(a.inputs["model"]), a.params["provider_options"]
    try:
        with fixed_dir(stage_name(ctx.key_components)) as d:  # the EP puts the path in the binary: fixed
            compile_graph(link_model(src, d, "model.onnx"), dst, a.params, ctx.tmp)
    except QnnCompileFailed as failed:  # QNN's verdict; anything else (reading, rewriting the model) is not
        e = failed.error
        error = compile_error(ctx.log_path, e, a.params["cpu_fallback"], options,
                              probe=lambda: fallback.probe(src, options, ctx.tmp),
                              cost="status" not in a.outputs,  # a search's refusal: no extra compile
                              model=src, trace=trace_dir(ctx.tmp))
        if "status" not in a.outputs:
            raise error from None
        print(f"candidate {a.id} dropped out: {error.message}")
        status = {"compiled": False, "error": error.message, "hint": error.hint, "nodes": getattr(error, "nodes", [])}
        for role in a.outputs:
            ctx.tmp_output(role).write_bytes(b"")
        ctx.tmp_output("status").write_text(json.dumps(status, indent=2, sort_keys=True))
        return
    if not wrapper_facts(dst)["binaries"]:  # with cpu_fallback QNN may take no node at all: no context to ship
        raise ActionError("QNN took none of the model's nodes: with compile.cpu_fallback every node would run on "
                          "the CPU and there is no context binary to build",
                          "nothing in this model runs on the NPU as it is (the log names the unsupported nodes): "
                          "run it with onnxruntime's CPU EP, or export the model with ops the HTP runs")
    if "status" in a.outputs:
        ctx.tmp_output("status").write_text(json.dumps({"compiled": True}, indent=2, sort_keys=True))
    if is_multi_soc(a):
        _normalize_build_time(ctx.tmp_output("bin"))
    wrappers = [dst]
    if "ctx_qio" in a.outputs:  # switch: alpha: the quantized-I/O wrapper of the same binary (lora/wrappers.py)
        wrappers.append(ctx.tmp_output("ctx_qio"))
        float_io_wrapper(dst, wrappers[1])
    from ctxbuild.qnn.lower import lower_file  # onnx: not on the restore path

    for w in wrappers:
        if "reference" in a.inputs:  # LoRA: the wrapper carries the slots' defaults, so adapters are optional
            add_wrapper_defaults(w, Path(a.inputs["reference"]))
            carry_alpha_map(w, Path(a.inputs["reference"]))
        lower_file(w)  # last: older onnxruntime versions must open what the steps above wrote


def is_multi_soc(action: Action) -> bool:
    return "," in action.params["provider_options"]["soc_model"]


def key_extras(action: Action) -> dict[str, Any]:
    """A multi-SoC binary embeds the reproducible-builds time (ctxbuild/reproducible.py): part of its key."""
    from ctxbuild.qnn.reproducible import build_time

    return {"build_time": build_time()} if is_multi_soc(action) else {}


def _normalize_build_time(path: Path) -> None:
    from ctxbuild.qnn.reproducible import build_time, normalize_multi_soc

    try:
        data, _ = normalize_multi_soc(path.read_bytes(), build_time())
    except ValueError as e:
        raise ActionError(f"cannot make the multi-SoC binary reproducible: {e}",
                          "this onnxruntime-qnn writes a container ctxbuild does not know; report it") from None
    path.write_bytes(data)  # a temp output, placed atomically by the runner


def partition_names(action: Action) -> dict[str, str | list[str]]:
    """graph -> its name inside the .bin (the EPContext node's partition_name); with cpu_fallback a graph
    can be split into several QNN partitions around CPU nodes: then the list of them, in order."""
    import onnx

    names: dict[str, str | list[str]] = {}
    for graph in action.params["graphs"]:
        role = f"ctx:{graph}" if f"ctx:{graph}" in action.outputs else "ctx"  # bundle vs single graph
        model = onnx.load(action.outputs[role], load_external_data=False)
        parts = [next(a.s.decode() for a in n.attribute if a.name == "partition_name")
                 for n in model.graph.node if n.op_type == "EPContext"]
        names[graph] = parts[0] if len(parts) == 1 else parts
    return names
