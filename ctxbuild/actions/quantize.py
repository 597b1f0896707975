"""quantize: QDQ with onnxruntime.quantization's QNN config, calibrated on the recipe's samples."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..action import Action
from .modelio import data_path, load
from .samples import from_files, input_spec, list_samples, random_samples


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
    # onnxruntime's quantizer writes scratch files (`<model>-inferred.onnx`) beside its input; actions sharing
    # one prepared model would race on them, so each works on a private link of the proto. The link sits
    # beside the model: onnx refuses external data that is a symlink or has several hard links.
    model = Path(a.inputs["model"])
    src = model.with_name(f".quantize-input-{os.getpid()}.onnx")
    os.link(model, src)
    try:
        _quantize(ctx, src)
    finally:
        src.unlink()


def _quantize(ctx: Any, src: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    a = ctx.action
    spec = input_spec(load(src, external_data=False))
    samples = list(random_samples(spec, a.params["samples"]) if a.params["random"]
                   else from_files(spec, discover_inputs(a), a.recipe_files[0]))
    config = get_qnn_qdq_config(str(src), _Reader(samples),
                                activation_type=getattr(QuantType, a.params["activation_type"]),
                                weight_type=getattr(QuantType, a.params["weight_type"]))
    config.use_external_data_format = True  # weights to `<output>.data`: no 2 GB protobuf limit
    dst = ctx.tmp_output("model")
    quantize(str(src), str(dst), config)
    data_path(dst).touch()  # the quantizer writes none when every tensor is small; the plan declares one


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of samples."""

    def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)
