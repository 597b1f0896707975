"""compile: ModelCompiler with the QNN plugin EP -> `<recipe>_ctx.onnx` (+ `_ctx_qnn.bin` unless embedded).

A precision search's candidate also writes `compile_status.json`. When QNN refuses to compile it (nodes it
cannot run at that quantization, a device configuration), the action succeeds with the refusal in its status
and empty placeholders for the model files, which nothing but the search reads: the candidate drops out and
the select action judges the others. The refusal is cached like any result (same inputs and compiler, same
refusal); anything else (out of memory, a crash, an interrupt) still fails the action and is not cached.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from ctxbuild.toolchain import installed as toolchain
from ctxbuild.plan.action import Action
from ctxbuild.lora.adapters import add_wrapper_defaults
from ctxbuild.errors import ActionError
from ctxbuild.qnn.staging import fixed_dir, link_model, stage_name
from ctxbuild.qnn import fallback, isolated, soccheck
from ctxbuild.verify import gates

_UNSUPPORTED = re.compile(r"\{ name: ([^,]*), type: ([^ }]*) \}")


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


class UnsupportedNodes(ActionError):
    """QNN refused these (name, op) nodes: a search stops on ops no quantization changes (verify/ladder.py)."""

    def __init__(self, message: str, hint: str | None, nodes: list[tuple[str, str]]) -> None:
        super().__init__(message, hint)
        self.nodes = nodes


CRASH_HINT = ("a fault in the QNN library on this graph, not in the model: the log's last lines show where; try "
              "another precision or compile.cpu_fallback: true, and report it with the model")


class QnnCompileFailed(Exception):
    """ModelCompiler itself failed (the log holds why): only this is reported as a QNN compile failure."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


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
                              cost="status" not in a.outputs)  # a search's refusal: no extra compile
        if "status" not in a.outputs:
            raise error from None
        print(f"candidate {a.id} dropped out: {error.message}")
        status = {"compiled": False, "error": error.message, "hint": error.hint, "nodes": getattr(error, "nodes", [])}
        for role in a.outputs:
            ctx.tmp_output(role).write_bytes(b"")
        ctx.tmp_output("status").write_text(json.dumps(status, indent=2, sort_keys=True))
        return
    if "status" in a.outputs:
        ctx.tmp_output("status").write_text(json.dumps({"compiled": True}, indent=2, sort_keys=True))
    if is_multi_soc(a):
        _normalize_build_time(ctx.tmp_output("bin"))
    if "reference" in a.inputs:  # LoRA: the wrapper carries the slots' defaults, so adapters are optional
        add_wrapper_defaults(dst, Path(a.inputs["reference"]))
    from ctxbuild.qnn.lower import lower_file  # onnx: not on the restore path

    lower_file(dst)  # last: older onnxruntime versions must open what the steps above wrote


def compile_graph(model: Path, dst: Path, params: dict[str, Any], tmp: Path) -> None:
    """One graph through ModelCompiler. With `split_outputs` its final Concats are cut off before compiling and
    re-joined in the wrapper after (split_outputs.py); with `quantized_io` its boundary Q/DQ are removed and
    their encodings recorded in the wrapper (quantized_io.py). Also builds diagnose.py's debug variants."""
    def compile_(src: Path) -> None:
        toolchain.qnn_devices()  # registered here, before the fork: each child inherits it
        try:
            isolated.call(toolchain.compile_model, src, dst, params["provider_options"], embed=params["embed"],
                          cpu_fallback=params["cpu_fallback"], what="the QNN compiler",
                          hint=CRASH_HINT)
        except (ActionError, MemoryError, OSError):
            raise
        except Exception as e:  # noqa: BLE001 - ORT's exceptions are untyped
            raise QnnCompileFailed(e) from e

    if split := params.get("split_outputs"):
        _compile_split(model, dst, None if split is True else list(split), compile_)
    elif params.get("quantized_io"):
        _compile_quantized_io(model, dst, compile_)
    else:
        compile_(model)


def _compile_split(model: Path, dst: Path, outputs: list[str] | None, compile_: Callable[[Path], None]) -> None:
    import onnx

    from ctxbuild.qnn.split_outputs import cut, rejoin
    from ctxbuild.graph.modelio import load

    # The graph only: the weights stay in the staged data files, which onnx refuses to read (hard links,
    # symlinks) and the EP reads as they are.
    original = load(model, external_data=False)
    cut_model, joins = cut(original, outputs)
    compile_(_save_beside(model, "split.onnx", cut_model))
    onnx.save(rejoin(onnx.load(str(dst), load_external_data=False), original, joins), dst)


def _compile_quantized_io(model: Path, dst: Path, compile_: Callable[[Path], None]) -> None:
    import onnx

    from ctxbuild.qnn import quantized_io
    from ctxbuild.graph.modelio import load

    stripped = load(model, external_data=False)  # weights stay in the linked data files, beside it
    encodings = quantized_io.strip(stripped)
    if not encodings:
        raise ActionError("compile.quantized_io: no graph input or output of the quantized model is quantized",
                          "remove compile.quantized_io (it applies to int16, int8, qdq and auto)")
    compile_(_save_beside(model, "quantized_io.onnx", stripped))
    wrapper = onnx.load(str(dst), load_external_data=False)
    quantized_io.write_metadata(wrapper, encodings)
    onnx.save(wrapper, dst)


def _save_beside(model: Path, name: str, proto: Any) -> Path:
    """A rewritten model beside `model`: in compile's fixed, key-named directory, with its data files."""
    import onnx

    path = model.with_name(name)
    onnx.save(proto, path)
    return path


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


def compile_error(log_path: Path, exc: Exception, cpu_fallback: bool, provider_options: dict[str, str] | None = None,
                  probe: Callable[[], fallback.Fallback | None] | None = None, cost: bool = False) -> ActionError:
    """Turn an EP failure into one line: a device configuration QNN refused (naming soc_model/htp_arch), or
    the nodes QNN rejected, named by its log or found by `probe` (a compile with CPU fallback: the nodes left
    outside EPContext, for ops QNN has no builder for, e.g. Det, which its log does not list). With `cost`, the
    hint to fall back says what the probe measured it would cost (partitions, CPU nodes, their MACs)."""
    import sys

    sys.stderr.flush()
    try:
        log = log_path.read_text(errors="replace")
    except OSError:
        log = ""
    if "QNN_DEVICE_ERROR_INVALID_CONFIG" in log:
        opts = provider_options or {}
        return ActionError(f"QNN refused the device configuration soc_model {opts.get('soc_model', '?')} / htp_arch "
                           f"{opts.get('htp_arch', '?')} (QNN_DEVICE_ERROR_INVALID_CONFIG)",
                           "check the target's soc_model and htp_arch (`ctxbuild targets` lists valid pairs)")
    nodes = list(dict.fromkeys(_UNSUPPORTED.findall(log)))
    probed = None
    unnamed = not nodes and "assigned to the default CPU EP" in str(exc)  # ops QNN has no builder for
    if probe is not None and (unnamed or (nodes and cost and not cpu_fallback)):
        probed = probe()
        nodes = nodes or (probed.cpu_nodes if probed else [])
    if nodes:
        listed = ", ".join(f"{n} ({t})" for n, t in nodes[:8]) + (" ..." if len(nodes) > 8 else "")
        hint = None if cpu_fallback else "set compile.cpu_fallback: true to run them on the CPU instead" + (
            f" (measured: {probed.describe()}; verify tells whether the accuracy survives the cuts)"
            if probed and cost else "")
        return UnsupportedNodes(f"QNN cannot run {len(nodes)} node(s): {listed}", hint, nodes)
    return ActionError(f"QNN compile failed: {str(exc).strip().splitlines()[-1][:300]}")


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
