"""Helpers the LoRA tests share: an adapter file's values, and the float model with an adapter merged in."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def adapter_values(path: Path) -> dict[str, np.ndarray]:
    fmt = ort.AdapterFormat.read_adapter(str(path))
    return {k: v.numpy().copy() for k, v in fmt.get_parameters().items()}


def merged_model(base: Path, weights: dict[str, np.ndarray], dst: Path) -> Path:
    """The float model with an adapter merged: its slot initializers replaced by the adapter's values."""
    model = onnx.load(base)
    for init in model.graph.initializer:
        if init.name in weights:
            init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
    onnx.save(model, dst)
    return dst
