"""quantize: QDQ with onnxruntime.quantization's QNN config, calibrated on the recipe's samples."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..action import Action
from .modelio import load
from .samples import from_files, input_spec, list_samples, random_samples

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
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    a = ctx.action
    # onnxruntime's quantizer writes scratch files (`<model>-inferred.onnx`) beside its input; actions sharing
    # one prepared model would race on them, so each works on a private link inside its own temp dir.
    src = ctx.tmp / "input.onnx"
    os.link(a.inputs["model"], src)
    spec = input_spec(load(src, external_data=False))
    samples = list(random_samples(spec, a.params["samples"]) if a.params["random"]
                   else from_files(spec, discover_inputs(a), a.recipe_files[0]))
    config = get_qnn_qdq_config(str(src), _Reader(samples),
                                activation_type=getattr(QuantType, a.params["activation_type"]),
                                weight_type=getattr(QuantType, a.params["weight_type"]))
    quantize(str(src), str(ctx.tmp_output("model")), config)


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of samples."""

    def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)
