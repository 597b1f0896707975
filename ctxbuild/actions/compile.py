"""compile: ModelCompiler with the QNN plugin EP -> `<recipe>_ctx.onnx` (+ `_ctx_qnn.bin` unless embedded)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .. import toolchain
from ..action import Action
from ..errors import ActionError
from ..staging import fixed_dir, link_model

_UNSUPPORTED = re.compile(r"\{ name: ([^,]*), type: ([^ }]*) \}")


def summarize(action: Action) -> dict[str, Any]:
    """Graph names as the binary holds them (loaders such as qnn.lora_config need them)."""
    return {"graph_names": partition_names(action)}


def run(ctx: Any) -> None:
    a = ctx.action
    dst = ctx.tmp_output("ctx")
    try:
        with fixed_dir(ctx.key) as d:
            toolchain.compile_model(link_model(Path(a.inputs["model"]), d, "model.onnx"), dst,
                                    a.params["provider_options"], embed=a.params["embed"],
                                    cpu_fallback=a.params["cpu_fallback"])
    except ActionError:
        raise
    except Exception as e:  # noqa: BLE001 - ORT's exceptions are untyped; the log holds the real cause
        raise compile_error(ctx.log_path, e, a.params["cpu_fallback"]) from None


def compile_error(log_path: Path, exc: Exception, cpu_fallback: bool) -> ActionError:
    """Turn an EP failure into one line: the nodes QNN rejected when its log names them."""
    import sys

    sys.stderr.flush()
    try:
        log = log_path.read_text(errors="replace")
    except OSError:
        log = ""
    nodes = list(dict.fromkeys(_UNSUPPORTED.findall(log)))
    if nodes:
        listed = ", ".join(f"{n} ({t})" for n, t in nodes[:8]) + (" ..." if len(nodes) > 8 else "")
        hint = None if cpu_fallback else "set compile.cpu_fallback: true to run them on the CPU instead"
        return ActionError(f"QNN cannot run {len(nodes)} node(s): {listed}", hint)
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
