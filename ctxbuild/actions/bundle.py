"""bundle: several graphs compiled into one weight-shared context binary (one `_ctx.onnx` per graph).

The session config entries below are all it takes on every published onnxruntime-qnn release (2.3.0 to 2.7.0):
each stores a shared weight once, and the provider option `enable_htp_weight_sharing` changes no byte
(measured: bench/toolchain_capabilities.py, docs/deploy.md).

QNN stores a weight once only when every graph holds it with identical quantized values and encodings;
that is checked here before compiling, so a silent doubling of flash/RAM becomes a clear error.

Graph I/O names must be unique within a share group once quantized: prefill's and decode's `hidden`
carry different encodings and the second graph fails with QNN error 7003 (measured, 2.7.0). Each graph
is compiled with `<graph>__`-prefixed I/O names; its wrapper gets the original names back and maps them
with the EP's own `io_name_overrides` attribute, so callers feed the names their models declare.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.toolchain import installed as toolchain
from ctxbuild.plan.action import Action
from ctxbuild.lora.adapters import add_wrapper_defaults
from ctxbuild.lora.wrappers import carry_alpha_map
from ctxbuild.errors import ActionError
from ctxbuild.actions.compile import summarize  # noqa: F401 - the same summary hook as compile
from ctxbuild.qnn.compile import compile_error
from ctxbuild.qnn.staging import fixed_dir, link_data, stage_name
from ctxbuild.graph.modelio import initializer_digests, load
from ctxbuild.qnn.soccheck import check_outputs  # noqa: F401 - the hook: the binary's SoC is the target's


def run(ctx: Any) -> None:
    a = ctx.action
    graphs: list[str] = a.params["graphs"]
    _check_shared_weights(a, graphs)
    ctx_paths = [ctx.tmp_output(f"ctx:{g}") for g in graphs]
    with fixed_dir(stage_name(ctx.key_components)) as d:  # one subdirectory per graph: their data files may share a name
        staged = {g: d / g / f"{g}.onnx" for g in graphs}
        renames = {g: _prefixed_copy(Path(a.inputs[f"model:{g}"]), g, staged[g]) for g in graphs}
        try:
            # One process, EP kept registered, fixed order, same provider options: the EP's share group.
            for i, (g, dst) in enumerate(zip(graphs, ctx_paths)):
                config = {"ep.share_ep_contexts": "1"}  # session config entries: as provider options they are ignored
                if i == len(graphs) - 1:
                    config["ep.stop_share_ep_contexts"] = "1"
                toolchain.compile_model(staged[g], dst, a.params["provider_options"], embed=False,
                                        cpu_fallback=a.params["cpu_fallback"], config=config)
        except Exception as e:  # noqa: BLE001 - ORT's exceptions are untyped; the log holds the cause
            raise compile_error(ctx.log_path, e, a.params["cpu_fallback"], a.params["provider_options"],
                                model=staged[g]) from None  # the graph refused: named as the user's model names it
    for g, p in zip(graphs, ctx_paths):
        _restore_io_names(p, renames[g])
        if a.params.get("adapters"):  # LoRA: the wrapper carries the slots' defaults (inputs become optional)
            add_wrapper_defaults(p, Path(a.inputs[f"reference:{g}"]))
            carry_alpha_map(p, Path(a.inputs[f"reference:{g}"]))  # switch: alpha (llm:): index <-> adapter
    _rename_bin(ctx_paths, ctx.tmp_output("bin"))
    from ctxbuild.qnn.lower import lower_file  # onnx: not on the restore path

    for p in ctx_paths:
        lower_file(p)  # last: older onnxruntime versions must open what the steps above wrote


def _prefixed_copy(src: Path, graph: str, dst: Path) -> dict[str, str]:
    """Save `src` with its graph inputs/outputs renamed `<graph>__<name>`, its external data linked beside
    it (never loaded); returns original -> new."""
    import onnx

    model = load(src, external_data=False)
    dst.parent.mkdir()
    link_data(src, dst.parent)
    io = [v.name for v in (*model.graph.input, *model.graph.output)]
    inits = {t.name for t in model.graph.initializer}
    ren = {n: f"{graph}__{n}" for n in io if n not in inits}
    for node in model.graph.node:
        node.input[:] = [ren.get(i, i) for i in node.input]
        node.output[:] = [ren.get(o, o) for o in node.output]
    for v in (*model.graph.input, *model.graph.output):
        v.name = ren.get(v.name, v.name)
    onnx.save(model, str(dst))
    return ren


def _restore_io_names(ctx_model: Path, ren: dict[str, str]) -> None:
    """Give the wrapper its original I/O names; `io_name_overrides` maps them to the names in the binary."""
    import onnx
    from onnx import helper

    model = onnx.load(str(ctx_model))
    back = {new: orig for orig, new in ren.items()}
    for node in model.graph.node:
        node.input[:] = [back.get(i, i) for i in node.input]
        node.output[:] = [back.get(o, o) for o in node.output]
        if node.op_type == "EPContext":
            overrides = dict(ren)
            for attr in list(node.attribute):
                if attr.name == "io_name_overrides":  # the EP's own map: onnx name -> qnn name
                    pairs = [kv.split("=", 1) for kv in attr.s.decode().split(";") if "=" in kv]
                    overrides.update({back.get(k, k): v for k, v in pairs})
                    node.attribute.remove(attr)
            node.attribute.append(helper.make_attribute(
                "io_name_overrides", "".join(f"{k}={v};" for k, v in sorted(overrides.items()))))
    for v in (*model.graph.input, *model.graph.output):
        v.name = back.get(v.name, v.name)
    onnx.save(model, str(ctx_model))


def _rename_bin(ctx_paths: list[Path], final_bin: Path) -> None:
    """The EP names the shared bin after the first graph; name it after the recipe and repoint every wrapper."""
    import onnx

    first_bin = ctx_paths[0].with_name(ctx_paths[0].stem + "_qnn.bin")
    bins = {p.name for p in ctx_paths[0].parent.glob("*_qnn.bin")}
    if bins != {first_bin.name}:
        raise ActionError(f"expected one shared context binary, the EP wrote {sorted(bins)}",
                          "the graphs were not compiled into one share group; is the EP library reloaded?")
    first_bin.rename(final_bin)
    for p in ctx_paths:
        model = onnx.load(str(p))
        for node in model.graph.node:
            for attr in node.attribute:
                if attr.name == "ep_cache_context":
                    attr.s = final_bin.name.encode()
        onnx.save(model, str(p))


def _check_shared_weights(a: Action, graphs: list[str]) -> None:
    """A weight the float models share (same name, same values) must quantize to the same bytes in each.

    Biases are exempt: QDQ quantizes them to int32 with scale = input scale x weight scale, so they follow
    each graph's activation calibration and differ legitimately (they are small; QNN keeps one per graph).
    """
    if not a.params.get("shared_weights"):
        return
    from onnx import TensorProto

    floats = {g: initializer_digests(Path(a.inputs[f"reference:{g}"])) for g in graphs}
    quant = {g: initializer_digests(Path(a.inputs[f"model:{g}"])) for g in graphs}
    # what each graph's nodes read: a weight one graph does not read (its `input_values:` took a branch without
    # it) is that graph's to drop, not a weight the two share
    read = {g: {t for n in load(Path(a.inputs[f"model:{g}"]), external_data=False).graph.node for t in n.input}
            for g in graphs}
    first = graphs[0]
    for other in graphs[1:]:
        for name, t in floats[first].items():
            if floats[other].get(name) != t or t[1] < 2:
                continue
            if not all(read[g] & {name, name + "_quantized"} for g in (first, other)):
                continue
            values = [quant[g].get(name + "_quantized") for g in (first, other)]
            if any(v is not None and v[0] == TensorProto.INT32 for v in values):
                print(f"bias '{name}' is quantized per graph (scale follows activations); not shared")
                continue
            for suffix in ("_quantized", "_scale", "_zero_point"):
                qa, qb = quant[first].get(name + suffix), quant[other].get(name + suffix)
                if qa is None and qb is None:
                    continue
                if qa != qb:
                    raise ActionError(
                        f"graphs '{first}' and '{other}' share weight '{name}' but quantize it differently "
                        f"({name + suffix} differs); QNN would store it twice",
                        "use the same quantization options for every graph (weight encodings come from the "
                        "weights themselves with the default QDQ config)")
