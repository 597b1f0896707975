"""quantize: QDQ with onnxruntime.quantization's QNN config, calibrated on the recipe's samples."""
from __future__ import annotations

import itertools
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ctxbuild.plan.action import Action
from ctxbuild.lora.adapters import CalibrationSet
from ctxbuild.lora.alpha import quantize_alpha_input
from ctxbuild.atomic import write_bytes
from ctxbuild.errors import ActionError, RecipeError, cause_line
from ctxbuild.recipes.quantization import FP16_NODE, QUANT_TYPES, get_qnn_qdq_kwargs
from ctxbuild.graph.external_data import onnx_readable
from ctxbuild.graph.modelio import data_path, load
from ctxbuild.graph.nodenames import OVERRIDES, Names, key
from ctxbuild.qnn.compile import per_run_cause
from ctxbuild.verify import gates
from ctxbuild.verify.islands import runs_quantized
from ctxbuild.graph.inputvalues import recorded
from ctxbuild.graph.samples import cast_warnings, from_files, input_spec, list_samples, random_samples

if TYPE_CHECKING:
    import numpy as np


def discover_inputs(action: Action) -> dict[str, Path]:
    if not action.watch:
        return {}
    return list_samples(Path(action.watch[0]), action.params["samples"], action.recipe_files[0])


def summarize(action: Action) -> dict[str, Any]:
    """Run once when quantize ran (the cache entry keeps it): what its samples show. Not in `warnings`, which
    runs on every restore too, where loading the model would import onnx and numpy (engine/run/runner.py)."""
    if gates.closed(action.inputs) or not action.watch:
        return {}
    files = list(list_samples(Path(action.watch[0]), action.params["samples"], action.recipe_files[0]).values())
    found = cast_warnings(action.description, files, input_spec(load(Path(action.inputs["model"]), external_data=False)))
    return {"warnings": found} if found else {}


def warnings(action: Action) -> list[str]:
    found = []
    if action.params["random"]:
        found.append(f"{action.description}: calibrating on random data (recipe says calibration.random); "
                     "accuracy on real inputs is unknown")
    if gates.closed(action.inputs):  # a precision-search rung no target needed: nothing was quantized
        return found
    nodes = (gates.decided_settings(action.inputs) or action.params["quantization"]).get("nodes")
    if nodes:  # pins that do nothing: a node prepare folded, weights set on a node without, a lone fp16 node
        prepared = load(Path(action.inputs["model"]), external_data=False)
        names = Names(prepared)
        if folded := [n for n in nodes if names.resolve(n) == []]:
            found.append(f"{action.description}: quantization.nodes: {', '.join(folded)}: folded into constants by "
                         "prepare, nothing of them runs: remove them")
        for name in weightless(prepared, nodes):
            found.append(f"{action.description}: quantization.nodes: {name}: {{weights: {nodes[name]['weights']}}} "
                         f"changes nothing here: {name} has no weights (set activations for its output, or pin a "
                         "node with weights)")
        fp16 = {n: names.resolve(n) or [] for n, o in nodes.items() if o == FP16_NODE}
        if lone := runs_quantized(load(Path(action.outputs["model"]), external_data=False), fp16):
            them = "it" if len(lone) == 1 else "them"
            found.append(f"{action.description}: quantization.nodes: {', '.join(lone)}: fp16 changes nothing here: "
                         f"the nodes around {them} are quantized, so {'its' if them == 'it' else 'their'} inputs and "
                         f"outputs are too and QNN runs {them} as a quantized op; pin {them} together with a neighbour "
                         "(the tensor between nodes pinned side by side stays float)")
    return found


def weightless(model: Any, nodes: dict[str, Any]) -> list[str]:
    """The pins of `nodes` that set only weights on nodes of `model` (the prepared model) with none: every node the
    name stands for reads no initializer but its bias (tensor_overrides' weights), so the pin sets nothing."""
    names = Names(model)
    inits = {i.name for i in model.graph.initializer}
    by_key = {key(n): n for n in model.graph.node}

    def weights(node: Any) -> bool:
        return any(t in inits and i != _BIAS_INPUT.get(node.op_type) for i, t in enumerate(node.input))

    return [n for n, o in nodes.items() if o != FP16_NODE and set(o) == {"weights"} and (found := names.resolve(n))
            and not any(weights(by_key[k]) for k in found if k in by_key)]


def run(ctx: Any) -> None:
    a = ctx.action
    if gates.closed(a.inputs):  # a precision-search rung no target needs
        gates.write_skipped(ctx)
        return
    with private_input(Path(a.inputs["model"])) as src:
        _quantize(ctx, src)


@contextmanager
def private_input(model: Path) -> Iterator[Path]:
    """A private proto of the model to quantize, beside it, that onnx's loader takes (external_data.onnx_readable:
    onnxruntime's quantizer reads its input through it, and writes scratch files beside it)."""
    with onnx_readable(model, f".quantize-input-{os.getpid()}-{next(_links)}.onnx") as src:
        try:
            yield src
        finally:
            src.with_name(src.name.replace("-input-", "-unfused-")).unlink(missing_ok=True)


_links = itertools.count()


def _quantize(ctx: Any, src: Path) -> None:
    a = ctx.action
    s = gates.decided_settings(a.inputs) or a.params["quantization"]  # the mixed rung's: decided by the search
    model = load(src, external_data=False)
    if cause := static_refusal(model):
        if a.params.get("search"):  # the candidate drops out, its screen says why, the ladder goes on (to fp16)
            print(f"candidate {a.id} dropped out: no static quantization of this export: {cause}")
            for role in a.outputs:
                ctx.tmp_output(role).write_bytes(b"")
            return
        raise ActionError(f"{a.recipe_files[0]}: no static quantization of this export: {cause}",
                          "or build it at precision: fp16 with compile.cpu_fallback: true")
    spec = input_spec(model)
    lora = CalibrationSet.of(a)  # LoRA: the slots' values come from the calibration adapters
    if lora:
        spec = lora.data_spec(spec)
    samples = list(random_samples(spec, a.params["samples"]) if a.params["random"]
                   else from_files(spec, discover_inputs(a), a.recipe_files[0], recorded(model)))
    if lora:
        samples = lora.expand(samples)
    quantize_model(src, ctx.tmp_output("model"), s, samples, a.recipe_files[0], model, a.params.get("outputs"),
                   a.params.get("input_values"))
    if a.params.get("alpha"):  # switch: alpha: lora_alpha itself quantized (the quantizer leaves a Gather's input)
        quantize_alpha_input(ctx.tmp_output("model"), next(iter(lora.defaults)) if lora else "lora_alpha")


def static_refusal(model: Any) -> str:
    """'' or why onnxruntime's static quantizer cannot quantize this export: it holds ops that quantize activations
    per run, which the quantizer breaks on (a KeyError on Kokoro-82M's)."""
    return per_run_cause(model, {n.op_type for n in model.graph.node}, cannot="onnxruntime's static quantizer")


def quantize_model(src: Path, dst: Path, s: dict[str, Any], samples: list[dict[str, np.ndarray]], recipe: str,
                   model: Any = None, cut: list[str] | None = None, values: dict[str, Any] | None = None) -> None:
    """`src` (a private input: private_input) quantized with settings `s`, calibrated on `samples`, to `dst`
    (weights in `<dst>.data`). `model`: src's proto without weights, when already loaded (not changed here).
    `cut`, `values`: the recipe's `outputs:` (src is the part they make) and `input_values:` (src keeps the If
    branches they take), named when a pin is not in the model they make."""
    from onnxruntime.quantization import quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from ctxbuild.graph.cut import outputs_line, values_line

    model = model if model is not None else load(src, external_data=False)
    made = [(f"`{values_line(values)}`", "makes", "an If branch the values do not take")] if values else []
    made += [(f"`{outputs_line(cut)}`", "cuts", "what lies past the cut")] if cut else []
    part = "" if not made else f" as {made[0][0]} {made[0][1]} it ({made[0][2]} is not built)" if len(made) == 1 \
        else f" as {made[0][0]} and {made[1][0]} make it ({made[0][2]} and {made[1][2]} are not built)"
    pinned = pinned_nodes(model, s["nodes"], recipe, part)
    unfused, src, written, named = _for_quantizer(model, src, bool(s["nodes"] or s["tensors"]))
    pinned = {named.get(p, p): o for p, o in pinned.items()}
    nodes = {q: o for p, o in pinned.items() for q in written.get(p, [p])}  # a written-out RMSNorm: all its nodes
    tensors = pinned_tensors(model, s["tensors"], recipe, part)
    _check_weight_tensors(model, s, tensors, pinned, recipe)
    overrides = tensor_overrides(unfused, tensors, nodes)
    def run(path: Path) -> None:
        config = get_qnn_qdq_config(str(path), _Reader(samples), init_overrides=overrides or None,
                                    nodes_to_exclude=[n for n, o in nodes.items() if o == FP16_NODE] or None,
                                    **get_qnn_qdq_kwargs(s))
        if s["percentile"] is not None:
            config.extra_options["CalibPercentile"] = s["percentile"]
        config.use_external_data_format = True  # weights to `<output>.data`: no 2 GB protobuf limit
        quantize(str(path), str(dst), config)

    try:
        try:
            run(src)
        except Exception as e:  # noqa: BLE001 - onnx's ValidationError; re-raised unless it is the link below
            if "hard link" not in str(e):
                raise
            # a data file gained a link after private_input found one (a compile of the same model stages it by
            # hard link): onnx's loader refuses it now, so the quantizer reads private copies of every data file
            src.with_name(f"{src.stem}-inferred.onnx").unlink(missing_ok=True)  # the quantizer's, left by the error
            with onnx_readable(src, src.with_suffix(".copied.onnx").name, copy=True) as copied:
                try:
                    run(copied)
                finally:
                    copied.with_name(f"{copied.stem}-inferred.onnx").unlink(missing_ok=True)
    except ValueError as e:  # onnxruntime's checks of the overrides (unknown tensor, bad axis...)
        raise ActionError(f"{recipe}: quantization: {cause_line(e)}",
                          "fix the recipe's quantization overrides") from None
    except RuntimeError as e:
        if (op := re.search(r"no registered schema.*?([A-Z][A-Za-z]+)\d*$", str(e).strip())) is None:
            raise
        # 16-bit QDQ makes the quantizer convert the model to opset 21; onnx converts only ops it has a schema for
        raise ActionError(f"the quantizer cannot convert the model to opset 21 (16-bit types): {op.group(1)} has no "
                          "ONNX schema", "SimplifiedLayerNormalization comes from prepare's rmsnorm rule (T5-style "
                          "RMSNorm, see docs/legalization.md): build it at precision fp16") from None
    data_path(dst).touch()  # the quantizer writes none when every tensor is small; the plan declares one
    fused = [n for n in model.graph.node if n.name in written and pinned.get(n.name) == FP16_NODE]
    if tensors or nodes:  # only the proto is rewritten, the weights stay in `<dst>.data`
        from ctxbuild.graph.legalize.rmsnorm import refuse

        qdq = load(dst, external_data=False)
        if fused:  # pinned RMSNorms (fp16: left in float) fused again: written out, the HTP's fp16 square overflows
            refuse(qdq, fused, written)
        # for QNN's refusal of a node they reach (nodenames.overrides_on)
        qdq.metadata_props.add(key=OVERRIDES, value=json.dumps({"tensors": sorted(tensors), "nodes": sorted(nodes)}))
        write_bytes(dst, qdq.SerializeToString())


def pinned_nodes(model: Any, nodes: dict[str, Any], recipe: str, part: str = "") -> dict[str, Any]:
    """quantization.nodes by the nodes of `model` (the prepared model, by nodenames.key: an unnamed node by its first
    output): each name, the user's model's or the prepared model's own, resolved through what prepare made of it
    (graph/nodenames.py). A name in neither model, or two names of one node set apart, is the recipe's mistake
    (`part`: how the recipe's `input_values:` and `outputs:` made the model, said with an unknown name)."""
    names = Names(model)
    where = f"{recipe}: quantization.nodes"

    def resolve(name: str) -> list[str] | None:
        if found := names.ambiguous(name):  # resolved to one of them silently before
            raise RecipeError(f"{where}: '{name}' names {len(found)} nodes: {'; '.join(found)}",
                              "rename the nodes in the model so that one name is one node (or pin the tensor the "
                              "node computes under quantization.tensors)")
        return names.resolve(name)

    return _by_prepared(nodes, resolve, names.close, where, "node",
                        "use the node names Netron shows for the recipe's model (an unnamed node: its first output's)",
                        part)


def pinned_tensors(model: Any, tensors: dict[str, Any], recipe: str, part: str = "") -> dict[str, Any]:
    """quantization.tensors by the tensors of `model` (the prepared model): each name, the user's model's or the
    prepared model's own, through what prepare made of it (graph/nodenames.py). A name in neither model, a tensor
    prepare folded away, or two names of one tensor set apart, is the recipe's mistake (`part`: as pinned_nodes)."""
    names = Names(model)
    where = f"{recipe}: quantization.tensors"

    def resolve(name: str) -> list[str] | None:
        found = names.tensor(name)
        if isinstance(found, list):
            instead = " or ".join(f"'{t}'" for t in found[:4])
            raise RecipeError(f"{where}: '{name}' was folded away by prepare (no tensor of the prepared model carries "
                              "its value)", f"set {instead} instead, which prepare computes from it in its place"
                              if found else "remove it: nothing computed from it is left")
        return None if found is None else [found]

    return _by_prepared(tensors, resolve, names.close_tensor, where, "tensor",
                        "use the tensor names Netron shows for the recipe's model", part)


def _check_weight_tensors(model: Any, s: dict[str, Any], tensors: dict[str, Any], nodes: dict[str, Any],
                          recipe: str) -> None:
    """A weight tensor set to int16 needs 16-bit activations on the nodes reading it, as the whole model's and a
    node's `weights: int16` do (recipes/quantization.problem: QNN refuses the node, error 3110). `tensors`, `nodes`:
    the recipe's settings by the prepared model's names (pinned_tensors, pinned_nodes)."""
    names = Names(model)
    weights = {i.name for i in model.graph.initializer}
    for given, o in s["tensors"].items():
        t = names.tensor(given)
        if o.get("type") != "int16" or t not in weights:
            continue
        for n in (n for n in model.graph.node if t in n.input and nodes.get(key(n)) != FP16_NODE):
            acts = next((tensors[x]["type"] for x in n.output if "type" in tensors.get(x, {})), None)
            if (acts or (nodes.get(key(n)) or {}).get("activations", s["activations"])) != "uint16":
                raise RecipeError(f"{recipe}: quantization.tensors: '{given}': int16 weights need uint16 activations "
                                  f"({names.label(n)} computes 8-bit activations)",
                                  "set activations: uint16 (the block's, or the node's in quantization.nodes), or "
                                  "leave the weight at the block's type")


def _by_prepared(given: dict[str, Any], resolve: Callable[[str], list[str] | None],
                 close: Callable[[str], str | None], where: str, what: str, otherwise: str, part: str
                 ) -> dict[str, Any]:
    """The recipe's settings by `what` name -> by the prepared model's `what`s (`resolve`); a name `resolve` does not
    know is the recipe's mistake (with the `close` match, else `otherwise`; `part`: what the recipe's cut or values
    left out of the prepared model, when it has them), as are two names of one prepared `what` set apart."""
    out: dict[str, Any] = {}
    by: dict[str, str] = {}
    for name, o in given.items():
        found = resolve(name)
        if found is None:
            near = close(name)
            raise RecipeError(f"{where}: '{name}' is not a {what} of the model{part}",
                              f"did you mean '{near}'?" if near else otherwise)
        for p in found:
            if out.get(p, o) != o:
                raise RecipeError(f"{where}: '{by[p]}' and '{name}' are one {what} after prepare's rewrites ('{p}') "
                                  "with different settings", "keep one of them")
            out[p], by[p] = o, name
    return out


def _for_quantizer(model: Any, src: Path, pins: bool) -> tuple[Any, Path, dict[str, list[str]], dict[str, str]]:
    """A copy of `model` as the quantizer reads it, the file holding it (saved beside `src`, its weights staying in
    the data files there; `src` itself when the copy is the same), each RMSNorm's written-out nodes and, with `pins`
    (per-node or per-tensor settings), the names given to the nodes the model leaves unnamed by their key. A graph
    output a Relu or Clip alone reads keeps its own range (_own_range_for_outputs).

    prepare's fused RMSNorms are written out again (graph/legalize/rmsnorm.py: the quantizer's opset conversion has
    no schema for them, and quantized activations do not overflow like fp16). onnxruntime's quantizer finds nodes
    by name, and its mixed-precision overrides refuse an unnamed node ("does not have a name!"): with `pins`, each
    unnamed node is named by its first output (nodenames.key, what quantization.nodes names it by)."""
    import onnx

    from ctxbuild.graph.legalize.rmsnorm import unfuse

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    named: dict[str, str] = {}
    if pins:
        taken = {n.name for n in copy.graph.node}
        for n in (n for n in copy.graph.node if not n.name and n.output):
            name, k = key(n), 0
            while name in taken:
                k += 1
                name = f"{key(n)}_{k}"
            n.name = named[key(n)] = name
            taken.add(name)
    written = unfuse(copy)
    changed = [bool(written), bool(named), _own_range_for_outputs(copy), _own_biases(copy)]  # each edits the copy
    if not any(changed):
        return copy, src, written, named
    dst = src.with_name(src.name.replace("-input-", "-unfused-"))
    onnx.save(copy, str(dst))
    return copy, dst, written, named


def _own_biases(model: Any) -> bool:
    """Give each Conv/ConvTranspose/Gemm its own copy of a bias it shares (True if any): onnxruntime's quantizer
    copies a shared bias as <name><n>, counting initializer names only, and a tensor already of that name then reads
    the copy's DequantizeLinear (basic-pitch, a TensorFlow export: 18 Convs share one bias 'X' and a Conv's output
    is 'X2'; onnxruntime's CPU EP refused the QDQ model). Copies named here are fresh against every name."""
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        if n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 2 and n.input[2] in inits:
            readers.setdefault(n.input[2], []).append(n)
    taken = set(inits) | {t for n in model.graph.node for t in list(n.input) + list(n.output)}
    shared = {b: nodes for b, nodes in readers.items() if len(nodes) > 1}
    for bias, nodes in shared.items():
        for k, n in enumerate(nodes[1:], 1):
            name = f"{bias}_own{k}"
            while name in taken:
                name += "_"
            taken.add(name)
            model.graph.initializer.add().CopyFrom(inits[bias])
            model.graph.initializer[-1].name = name
            n.input[2] = name
    return bool(shared)


# onnxruntime's quantizer gives the input of these ops their output's range when they alone read it
# (BaseQuantizer.adjust_tensor_ranges): a Relu's input then clamps at 0.
_RANGE_FROM_OUTPUT = ("Relu", "Clip")


def _own_range_for_outputs(model: Any) -> bool:
    """A graph output that a Relu or Clip alone reads (a recipe's `outputs:` naming a tensor and the Relu after it,
    or a model giving both) would take that op's range in the quantizer and lose its negative values (cosine 0.65
    on a MatMul's output, on the CPU and the HTP alike): the op reads it through an Identity instead, so the output
    keeps its own range (the quantizer then drops the Relu: the Identity's QuantizeLinear clamps). True when any."""
    from collections import Counter

    import onnx

    outputs = {o.name for o in model.graph.output}
    readers = Counter(t for n in model.graph.node for t in n.input)
    nodes, taken, changed = [], {t for n in model.graph.node for t in (*n.input, *n.output, n.name)}, False
    for n in model.graph.node:
        t = n.input[0] if n.input else ""
        if n.op_type in _RANGE_FROM_OUTPUT and t in outputs and readers[t] == 1:
            via, k = f"{t}_own_range", 0
            while via in taken:
                k += 1
                via = f"{t}_own_range_{k}"
            taken.add(via)
            nodes.append(onnx.helper.make_node("Identity", [t], [via], name=via))
            n.input[0], changed = via, True
        nodes.append(n)
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return changed


# Inputs of these ops that are biases: QDQ quantizes them to int32 from the input and weight scales.
_BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}


def tensor_overrides(model: Any, tensors: dict[str, Any], nodes: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """onnxruntime TensorQuantOverrides from the recipe's per-tensor settings and the per-node ones (`nodes`: by
    the nodes of `model`, pinned_nodes; tensors win). A node override sets the type of the node's weights
    (initializer inputs, biases excepted) and outputs."""
    import numpy as np
    from onnxruntime.quantization import QuantType

    def qtype(name: str) -> Any:
        return getattr(QuantType, QUANT_TYPES[name])

    out: dict[str, list[dict[str, Any]]] = {}
    if nodes:
        inits = {i.name for i in model.graph.initializer}
        by_name = {n.name: n for n in model.graph.node}
        for name, o in nodes.items():
            if o == FP16_NODE:  # not quantized at all: nodes_to_exclude
                continue
            node = by_name[name]
            for i, t in enumerate(node.input):
                if t in inits and "weights" in o and i != _BIAS_INPUT.get(node.op_type):
                    out[t] = [{"quant_type": qtype(o["weights"]), "symmetric": o["weights"].startswith("int")}]
            for t in node.output:
                if "activations" in o:
                    out[t] = [{"quant_type": qtype(o["activations"])}]
    for name, o in tensors.items():
        entry: dict[str, Any] = {}
        if "type" in o:
            entry["quant_type"] = qtype(o["type"])
        for k in ("symmetric", "axis"):
            if k in o:
                entry[k] = o[k]
        if "rmin" in o:
            entry["rmin"], entry["rmax"] = np.array(o["rmin"], np.float32), np.array(o["rmax"], np.float32)
        out[name] = [entry]
    return out


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of samples."""

    def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)
