"""quantize: QDQ with onnxruntime.quantization's QNN config, calibrated on the recipe's samples."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..action import Action
from ..errors import ActionError
from .modelio import graph_inputs, load

RANDOM_SEED = 0


def discover_inputs(action: Action) -> dict[str, Path]:
    if not action.watch:
        return {}
    d = Path(action.watch[0])
    files = sorted(p for p in d.iterdir() if p.suffix in (".npz", ".npy") and p.is_file())
    if not files:
        raise ActionError(f"{action.recipe_files[0]}: calibration dir {d} has no .npz/.npy samples",
                          "add samples, one .npz per sample keyed by input name")
    return {f"calibration:{p.name}": p for p in files[: action.params["samples"]]}


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
    spec = _input_spec(load(src, external_data=False))
    samples = list(_random(spec, a.params["samples"]) if a.params["random"]
                   else _from_files(spec, discover_inputs(a), a.recipe_files[0]))
    config = get_qnn_qdq_config(str(src), _Reader(samples),
                                activation_type=getattr(QuantType, a.params["activation_type"]),
                                weight_type=getattr(QuantType, a.params["weight_type"]))
    quantize(str(src), str(ctx.tmp_output("model")), config)


def _input_spec(model: Any) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    from onnx.helper import tensor_dtype_to_np_dtype

    return {i.name: (tuple(d.dim_value for d in i.type.tensor_type.shape.dim),
                     np.dtype(tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))) for i in graph_inputs(model)}


def _random(spec: dict[str, tuple[tuple[int, ...], np.dtype]], n: int) -> Iterator[dict[str, np.ndarray]]:
    rng = np.random.default_rng(RANDOM_SEED)
    for _ in range(n):
        yield {name: rng.random(shape).astype(dtype) for name, (shape, dtype) in spec.items()}


def _from_files(spec: dict[str, tuple[tuple[int, ...], np.dtype]], files: dict[str, Path],
                recipe: str) -> Iterator[dict[str, np.ndarray]]:
    for path in files.values():
        yield check_sample(load_sample(path, spec), spec, path, recipe)


def load_sample(path: Path, spec: dict[str, Any]) -> dict[str, np.ndarray]:
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        if len(spec) != 1:
            raise ActionError(f"{path}: a .npy sample holds one array but the model has inputs "
                              f"{', '.join(spec)}", "use .npz files keyed by input name")
        return {next(iter(spec)): np.load(path, allow_pickle=False)}
    except (OSError, ValueError) as e:
        raise ActionError(f"{path}: cannot read sample: {str(e).splitlines()[0]}") from None


def check_sample(sample: dict[str, np.ndarray], spec: dict[str, tuple[tuple[int, ...], np.dtype]],
                 path: Path, recipe: str) -> dict[str, np.ndarray]:
    unknown = sorted(set(sample) - set(spec))
    missing = sorted(set(spec) - set(sample))
    if unknown or missing:
        raise ActionError(f"{path}: sample keys {sorted(sample)} do not match the model inputs {sorted(spec)}"
                          + (f" (unknown: {', '.join(unknown)})" if unknown else "")
                          + (f" (missing: {', '.join(missing)})" if missing else ""),
                          f"name the arrays after the inputs (recipe {recipe})")
    out = {}
    for name, arr in sample.items():
        shape, dtype = spec[name]
        if tuple(arr.shape) != shape:
            raise ActionError(f"{path}: '{name}' has shape {list(arr.shape)}, the recipe fixes it to {list(shape)}",
                              "regenerate the samples at the recipe's input shape")
        out[name] = arr.astype(dtype, copy=False)
    return out


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a list of samples."""

    def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(samples)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)
