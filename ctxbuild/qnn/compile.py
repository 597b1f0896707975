"""One graph through onnxruntime's ModelCompiler with the QNN EP, and QNN's failures turned into one line.

Used by the compile action and by the per-layer diagnosis's debug variants (verify/probe.py)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from ctxbuild.errors import ActionError, cause_line
from ctxbuild.graph.nodenames import named, overrides_on, shown
from ctxbuild.qnn import fallback, isolated, optrace
from ctxbuild.toolchain import installed as toolchain

_UNSUPPORTED = re.compile(r"\{ name: ([^,]*), type: ([^ }]*) \}")


class UnsupportedNodes(ActionError):
    """QNN refused these (name, op) nodes: a search stops on ops no quantization changes (verify/ladder.py)."""

    def __init__(self, message: str, hint: str | None, nodes: list[tuple[str, str]]) -> None:
        super().__init__(message, hint)
        self.nodes = nodes


# onnxruntime's per-run (dynamic) int8 ops: the HTP has no run-time activation quantization
PER_RUN = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul"}

CRASH_HINT = ("a fault in the QNN library on this graph, not in the model: the log's last lines show where; try "
              "another precision or compile.cpu_fallback: true, and report it with the model")


class QnnCompileFailed(Exception):
    """ModelCompiler itself failed (the log holds why): only this is reported as a QNN compile failure."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def compile_graph(model: Path, dst: Path, params: dict[str, Any], tmp: Path) -> None:
    """One graph through ModelCompiler. With `split_outputs` its final Concats are cut off before compiling and
    re-joined in the wrapper after (split_outputs.py); with `quantized_io` its boundary Q/DQ are removed and
    their encodings recorded in the wrapper (quantized_io.py); with `fp16_rewrite` the fp16 rules rewrite it first
    (graph/legalize FP16_RULES). The EP's op trace goes to trace_dir(tmp), failed or not (qnn/optrace.py). Also
    builds verify/probe.py's debug variants."""
    # the trace: the same binary, not part of the action key; {} where the toolchain has none
    options = {**params["provider_options"], **optrace.provider_options(trace_dir(tmp))}

    def compile_(src: Path) -> None:
        toolchain.qnn_devices()  # registered here, before the fork: each child inherits it
        try:
            isolated.call(toolchain.compile_model, src, dst, options, embed=params["embed"],
                          cpu_fallback=params["cpu_fallback"], what="the QNN compiler", hint=CRASH_HINT)
        except (ActionError, MemoryError, OSError):
            raise
        except Exception as e:  # noqa: BLE001 - ORT's exceptions are untyped
            raise QnnCompileFailed(e) from e

    if fp16 := params.get("fp16_rewrite"):
        model = _fp16_rewritten(model, fp16["rules"])
    if split := params.get("split_outputs"):
        _compile_split(model, dst, None if split is True else list(split), compile_)
    elif params.get("quantized_io"):
        _compile_quantized_io(model, dst, compile_)
    else:
        compile_(model)


def trace_dir(tmp: Path) -> Path:
    """Where compile_graph has the EP write its op trace."""
    return tmp / "optrace"


def _fp16_rewritten(model: Path, rules: list[str]) -> Path:
    """The model with the fp16 rules applied (graph/legalize FP16_RULES), beside it; itself when none applies."""
    from ctxbuild.graph.legalize import legalize_fp16
    from ctxbuild.graph.modelio import load

    proto = load(model, external_data=False)  # the weights stay in the linked data files
    done = legalize_fp16(proto, rules)
    if not done:
        return model
    print("fp16 rewrites: " + ", ".join(f"{n} {r}" for r, n in done.items()))
    return _save_beside(model, "fp16.onnx", proto)


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
                          "remove compile.quantized_io (it applies to w8a16, w8a8, w16a16, qdq and auto)")
    compile_(_save_beside(model, "quantized_io.onnx", stripped))
    wrapper = onnx.load(str(dst), load_external_data=False)
    quantized_io.write_metadata(wrapper, encodings)
    onnx.save(wrapper, dst)


def _save_beside(model: Path, name: str, proto: Any) -> Path:
    """A rewritten model beside `model`: in compile's fixed, key-named directory, with its data files. Where the
    stage holds them as symlinks (OUT on another filesystem than /tmp: no hard links), they become copies:
    onnxruntime refuses data that resolves outside the directory of a model that is a real file ("External data
    path escapes model directory"; the symlinked model.onnx passes, resolved to its target's directory)."""
    import shutil

    import onnx

    from ctxbuild.graph.modelio import external_data_files

    path = model.with_name(name)
    onnx.save(proto, path)
    for role in external_data_files(proto, path, follow_links=True):
        data = path.parent / role.removeprefix("external:")
        if data.is_symlink():
            copy = data.with_name(f".{data.name}.copy")
            shutil.copyfile(data.resolve(), copy)
            copy.replace(data)
    return path


def per_run_cause(proto: Any, ops: set[str], cannot: str = "the HTP") -> str:
    """'' or, when `ops` hold ops that quantize activations per run: that `cannot` (what refuses them) cannot, why
    prepare's dynamic_int8 rule did not make them float (withdrawn by the sample check, or an op it does not
    rewrite), and the export to build from instead (the recipe's `model:`)."""
    from ctxbuild.graph.legalize import withdrawn

    found = sorted(ops & PER_RUN)
    if not found:
        return ""
    why = withdrawn(proto).get("dynamic_int8")
    rule = (f"prepare's dynamic_int8 rule, which makes them float, was withdrawn by the sample check ({why})" if why
            else "prepare's dynamic_int8 rule makes MatMulInteger float, not these")
    return (f"{', '.join(found)} quantize activations per run, which {cannot} cannot; {rule}: point the recipe's "
            "`model:` at the float model the export was quantized from")


def _split_first(proto: Any, nodes: list[tuple[str, str]]) -> str | None:
    """When refused nodes make the model's sizes follow its data (NonZero, ...): the line that builds its static
    part (prepare's sample check found it, else cut before those ops), the first thing to do: every refusal
    after them is moot for a fixed graph."""
    from ctxbuild.graph.cut import DATA_DEPENDENT_OPS, split_line
    from ctxbuild.graph.legalize import split_met

    ops = sorted({t for _, t in nodes} & DATA_DEPENDENT_OPS)
    if not ops:
        return None
    line = split_met(proto) or split_line(proto, set(ops))
    return f"{', '.join(ops)}: {line}" if line else None


def compile_error(log_path: Path, exc: Exception, cpu_fallback: bool, provider_options: dict[str, str] | None = None,
                  probe: Callable[[], fallback.Fallback | None] | None = None, cost: bool = False,
                  model: Path | None = None, trace: Path | None = None) -> ActionError:
    """Turn an EP failure into one line: a device configuration QNN refused (naming soc_model/htp_arch), or
    the nodes QNN rejected, named by its log or found by `probe` (a compile with CPU fallback: the nodes left
    outside EPContext, for ops QNN has no builder for, e.g. Det, which its log does not list). With `cost`, the
    hint to fall back says what the probe measured it would cost (partitions, CPU nodes, their MACs). `model`: the
    graph compiled (the prepared or QDQ model), whose nodes are named as the user's model names them
    (graph/nodenames.py: through prepare's rewrites, an unnamed node by its first output, a quantizer's Q/DQ by the
    user's tensor it quantizes). `trace`: the compile's op trace directory (qnn/optrace.py): the refused nodes
    where the log names none, and the EP's reason for each, said beside the node."""
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
    why, unit = optrace.refused(trace)
    nodes = [n for n in nodes if n not in unit]  # a refused QDQ unit is its node
    unnamed = not nodes and "assigned to the default CPU EP" in str(exc)  # the log names none (QNN took nothing)
    if unnamed and why:
        nodes, unnamed = list(why), False  # the trace does: no probe compile to find them
    probed = None
    if probe is not None and (unnamed or (nodes and cost and not cpu_fallback)):
        probed = probe()
        nodes = nodes or (probed.cpu_nodes if probed else [])
    reached, proto = None, None
    if nodes and model is not None:
        from ctxbuild.graph.modelio import load

        proto = load(model, external_data=False)
        reached = overrides_on(proto, nodes)
        why = {named(proto, [n])[0]: r for n, r in why.items()}
        nodes = named(proto, nodes)
    if nodes:
        # the EP's reason after its node: "; " between them, as a reason may hold commas
        listed = ("; " if any(why.get(n) for n in nodes[:8]) else ", ").join(
            shown(n, t) + (f": {r}" if (r := why.get((n, t))) else "") for n, t in nodes[:8]) + (
            " ..." if len(nodes) > 8 else "")
        cause = per_run_cause(proto, {t for _, t in nodes}) if proto is not None else ""
        hint = None if cpu_fallback else (f"{cause}, or " if cause else "") + \
            "set compile.cpu_fallback: true to run them on the CPU instead" + (
            f" (measured: {probed.describe()}; verify tells whether the accuracy survives the cuts)"
            if probed and cost else "")
        if proto is not None and not cpu_fallback and (split := _split_first(proto, nodes)):
            hint = f"{split}; or {hint}"  # the cut first: every refusal after those ops is moot for a fixed graph
        if reached:  # the recipe's own override made the types QNN refuses: that is what to change
            hint = (f"the recipe's {reached} set the types QNN refuses for these nodes: change or remove those "
                    "overrides" + (f" (or {hint})" if hint else ""))
        return UnsupportedNodes(f"QNN cannot run {len(nodes)} node(s): {listed}", hint, nodes)
    if "QNN_COMMON_ERROR_MEM_ALLOC" in f"{exc}{log}":
        return ActionError(f"QNN compile failed: {cause_line(exc, last=True)}",
                           _mem_alloc_hint((provider_options or {}).get("htp_graph_finalization_optimization_mode")))
    return ActionError(f"QNN compile failed: {cause_line(exc, last=True)}")


def _mem_alloc_hint(mode: str | None) -> str:
    """QNN's finalize ran out of memory: its graph optimization mode changes how (measured: khmersm's character
    transformer at int16 compiled with mode 1, the default and 3 refused it; a quantized Conv1d of 128 channels x
    dilation 2048 over 11596 samples compiled with any explicit mode, over 4596 with none)."""
    if mode is None:
        return "QNN's graph optimization ran out of memory: try compile: {optimization_mode: 1} (or 2, 3) in the recipe"
    others = ", ".join(m for m in ("1", "2", "3") if m != str(mode))
    return f"QNN's graph optimization ran out of memory at optimization_mode {mode}: try {others} (compile.optimization_mode)"
