"""quantize: QDQ with onnxruntime.quantization's QNN config, calibrated on the recipe's samples."""
from __future__ import annotations

import difflib
import itertools
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ctxbuild.plan.action import Action
from ctxbuild.lora.adapters import CalibrationSet
from ctxbuild.errors import ActionError, cause_line
from ctxbuild.recipes.quantization import FP16_NODE, QUANT_TYPES, get_qnn_qdq_kwargs
from ctxbuild.graph.external_data import onnx_readable
from ctxbuild.graph.modelio import data_path, load
from ctxbuild.verify import gates
from ctxbuild.graph.samples import from_files, input_spec, list_samples, random_samples

if TYPE_CHECKING:
    import numpy as np


def discover_inputs(action: Action) -> dict[str, Path]:
    if not action.watch:
        return {}
    return list_samples(Path(action.watch[0]), action.params["samples"], action.recipe_files[0])


def warnings(action: Action) -> list[str]:
    if action.params["random"]:
        return [f"{action.description}: calibrating on random data (recipe says calibration.random); "
                "accuracy on real inputs is unknown"]
    return []


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
    spec = input_spec(model)
    lora = CalibrationSet.of(a)  # LoRA: the slots' values come from the calibration adapters
    if lora:
        spec = lora.data_spec(spec)
    samples = list(random_samples(spec, a.params["samples"]) if a.params["random"]
                   else from_files(spec, discover_inputs(a), a.recipe_files[0]))
    if lora:
        samples = lora.expand(samples)
    quantize_model(src, ctx.tmp_output("model"), s, samples, a.recipe_files[0], model)


def quantize_model(src: Path, dst: Path, s: dict[str, Any], samples: list[dict[str, np.ndarray]], recipe: str,
                   model: Any = None) -> None:
    """`src` (a private input: private_input) quantized with settings `s`, calibrated on `samples`, to `dst`
    (weights in `<dst>.data`). `model`: src's proto without weights, when already loaded."""
    from onnxruntime.quantization import quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    model = model if model is not None else load(src, external_data=False)
    overrides = tensor_overrides(model, s, recipe)
    src = _unfused(model, src)
    try:
        config = get_qnn_qdq_config(str(src), _Reader(samples), init_overrides=overrides or None,
                                    nodes_to_exclude=fp16_nodes(model, s, recipe) or None,
                                    **get_qnn_qdq_kwargs(s))
        if s["percentile"] is not None:
            config.extra_options["CalibPercentile"] = s["percentile"]
        config.use_external_data_format = True  # weights to `<output>.data`: no 2 GB protobuf limit
        quantize(str(src), str(dst), config)
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


def _unfused(model: Any, src: Path) -> Path:
    """The model with prepare's fused RMSNorms written out again (graph/legalize/rmsnorm.py: the quantizer's
    opset conversion has no schema for them, and quantized activations do not overflow like fp16), saved
    beside `src` (its weights stay in the data files there); `src` itself when it has none."""
    import onnx

    from ctxbuild.graph.legalize.rmsnorm import unfuse

    if not unfuse(model):
        return src
    dst = src.with_name(src.name.replace("-input-", "-unfused-"))
    onnx.save(model, str(dst))
    return dst


# Inputs of these ops that are biases: QDQ quantizes them to int32 from the input and weight scales.
_BIAS_INPUT = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}


def tensor_overrides(model: Any, s: dict[str, Any], recipe: str) -> dict[str, list[dict[str, Any]]]:
    """onnxruntime TensorQuantOverrides from the recipe's per-node and per-tensor settings (tensors win).
    A node override sets the type of the node's weights (initializer inputs, biases excepted) and outputs."""
    import numpy as np
    from onnxruntime.quantization import QuantType

    def qtype(name: str) -> Any:
        return getattr(QuantType, QUANT_TYPES[name])

    out: dict[str, list[dict[str, Any]]] = {}
    if s["nodes"]:
        inits = {i.name for i in model.graph.initializer}
        nodes = named_nodes(model, s, recipe)
        for name, o in s["nodes"].items():
            if o == FP16_NODE:  # not quantized at all: fp16_nodes
                continue
            node = nodes[name]
            for i, t in enumerate(node.input):
                if t in inits and "weights" in o and i != _BIAS_INPUT.get(node.op_type):
                    out[t] = [{"quant_type": qtype(o["weights"]), "symmetric": o["weights"].startswith("int")}]
            for t in node.output:
                if "activations" in o:
                    out[t] = [{"quant_type": qtype(o["activations"])}]
    for name, o in s["tensors"].items():
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


def named_nodes(model: Any, s: dict[str, Any], recipe: str) -> dict[str, Any]:
    """The model's nodes by name, after checking that every node quantization.nodes names is one of them."""
    nodes = {n.name: n for n in model.graph.node}
    for name in s["nodes"]:
        if name not in nodes:
            close = difflib.get_close_matches(name, list(nodes), n=1)
            raise ActionError(f"{recipe}: quantization.nodes: '{name}' is not a node of the model",
                              f"did you mean '{close[0]}'?" if close else "use the node names `ctxbuild inspect` "
                              "or Netron show for the prepared model")
    return nodes


def fp16_nodes(model: Any, s: dict[str, Any], recipe: str) -> list[str]:
    """The nodes quantization.nodes keeps in float (onnxruntime's nodes_to_exclude): no Q/DQ around them."""
    named_nodes(model, s, recipe)
    return [n for n, o in s["nodes"].items() if o == FP16_NODE]


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of samples."""

    def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)
