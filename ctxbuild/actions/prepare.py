"""prepare: fix input shapes, stamp an IR version onnxruntime reads, reject control flow, fold with ORT's basic optimizer,
legalize ops the HTP does not run (ctxbuild.graph.legalize: Einsum, GatherND, dynamic int8, runtime Clip bounds).

The output's weights always go to external data (`prepared.onnx.data`): models over the 2 GB protobuf
limit then flow like any other, and the weights are never loaded into Python memory here."""
from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild.lora.adapters import add_defaults, make_slots
from ctxbuild.errors import ActionError
from ctxbuild.graph.modelio import data_path, external_data_files, graph_inputs, load, save_external, save_with_data

# Measured: onnxruntime 1.31 loads IR <= 13; onnx 1.23 writes 14 by default. Stamp down to what ORT reads.
ORT_MAX_IR_VERSION = 13
CONTROL_FLOW = ("If", "Loop", "Scan")
EXTERNAL_MIN_BYTES = 1024  # onnx's own default threshold for external data


def key_extras(action: Action) -> dict[str, Any]:
    """The legalization rules' own code, keyed: a rule added or changed re-prepares what it may rewrite (and
    everything after it) without an ACTION_SCHEMA_VERSION bump, which rules added under one version missed."""
    return {} if action.params.get("rewrite", True) is False else {"legalize": rules_digest(RULES_DIR)}


RULES_DIR = Path(__file__).resolve().parent.parent / "graph" / "legalize"


@lru_cache(maxsize=None)
def rules_digest(directory: Path) -> str:
    """sha256 over the rule modules' source (read, not imported: a restore imports no onnx)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(directory.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def discover_inputs(action: Action) -> dict[str, Path]:
    path = Path(action.inputs["model"])
    return external_data_files(load(path, external_data=False), path)


def run(ctx: Any) -> None:
    import onnx

    src = Path(ctx.action.inputs["model"])
    model = load(src, external_data=False)
    if model.ir_version > onnx.IR_VERSION:
        raise ActionError(f"{src}: IR version {model.ir_version} is newer than this toolchain reads "
                          f"(onnx {onnx.__version__}: <= {onnx.IR_VERSION})",
                          "re-export with an older onnx, or upgrade onnx/onnxruntime")
    model.ir_version = min(model.ir_version, ORT_MAX_IR_VERSION)
    flow = [f"'{n.name or '?'}' ({n.op_type})" for n in model.graph.node if n.op_type in CONTROL_FLOW]
    if flow:
        raise ActionError(f"{src}: control flow is not supported on QNN: node {', '.join(flow[:5])}",
                          "export the model without If/Loop/Scan (unroll, or split it into graphs)")
    _fix_shapes(model, src, ctx.action.params["inputs"], ctx.action.recipe_files[0])
    slots = ctx.action.params.get("adapter_slots")
    if slots:  # LoRA: slots become graph inputs before folding (folding would rename or merge them)
        defaults = make_slots(model, slots["patterns"], slots["scaling"])
    dst = ctx.tmp_output("model")
    if ctx.action.params["optimize"]:
        _optimize(model, src, dst, ctx.tmp / "staged")
    else:
        save_external(model, src.parent, dst)
    rules = ctx.action.params.get("rewrite", True)
    if rules:
        _legalize(dst, ctx.tmp, ctx.action.params["optimize"], None if rules is True else rules)
    if slots:  # the float reference: the same graph with the defaults as overridable initializers
        reference = onnx.load(str(dst))
        add_defaults(reference, defaults)
        save_with_data(reference, ctx.tmp_output("reference"))


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
    """The rewrites legalization made ({} when none), from the prepared model's metadata."""
    from ctxbuild.graph.legalize import METADATA_KEY

    model = load(Path(action.outputs["model"]), external_data=False)
    found = next((p.value for p in model.metadata_props if p.key == METADATA_KEY), None)
    return {"rewrites": json.loads(found)} if found else {}


def _legalize(dst: Path, tmp: Path, optimize: bool, only: list[str] | None) -> None:
    """Rewrite what the HTP cannot run (rules in ctxbuild.graph.legalize); the weights are loaded only when a
    rule's op is present. After a rewrite the optimizer runs again: it folds the Transposes of weights."""
    import onnx

    from ctxbuild.graph.legalize import METADATA_KEY, legalize, wanted

    if not wanted(load(dst, external_data=False), only):
        return
    model = load(dst)
    counts = legalize(model, only)
    if not counts:
        return
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                        METADATA_KEY: json.dumps(counts)})
    if not optimize:
        save_with_data(model, dst)
        return
    legal = tmp / "legal" / "legal.onnx"
    legal.parent.mkdir()
    save_with_data(model, legal)
    del model
    _optimize(load(legal, external_data=False), legal, dst, tmp / "restaged")


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
        raise ActionError(f"onnxruntime rejected the model: {str(e).splitlines()[0][:300]}") from None
    data_path(dst).touch()  # ORT writes no data file when no initializer is that big; the plan declares one
