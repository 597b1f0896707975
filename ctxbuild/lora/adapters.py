"""LoRA adapters: slots (the base model's weights an adapter replaces), adapter files and their checks.

A slot is a graph input of the prepared model whose default value (the base model's weight, or zeros for
an input the exporter already made) is kept as an initializer of the same name in the float reference and
in the `_ctx.onnx` wrapper: onnxruntime then treats the input as optional, and an `.onnx_adapter` bound
with `RunOptions.add_active_adapter` overrides it per run.

Adapter files are read with the field's own readers: onnxruntime's `AdapterFormat` (.onnx_adapter), the
`safetensors` package (.safetensors) and numpy (.npz). Errors name the adapter file and the tensor.
"""
from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxbuild.errors import ActionError, cause_line
from ctxbuild.graph.samples import read_arrays

FORMATS = (".onnx_adapter", ".safetensors", ".npz")  # adapter files a recipe may name

if TYPE_CHECKING:  # imported where arrays are made: a cache hit needs no numpy
    import numpy as np

SlotSpec = dict[str, tuple[tuple[int, ...], "np.dtype"]]


def match_slots(patterns: list[str], initializers: list[str], inputs: list[str], field: str = "slots"
                ) -> dict[str, str]:
    """slot name -> "initializer" | "input", for every initializer or graph input a pattern matches."""
    found: dict[str, str] = {}
    for pattern in patterns:
        hits = [(n, "initializer") for n in initializers if fnmatch.fnmatchcase(n, pattern)]
        hits += [(n, "input") for n in inputs if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ActionError(f"adapters.{field}: '{pattern}' matches no initializer or input of the model",
                              "slots are names or glob patterns (e.g. '*lora_A*') of the model's LoRA weights")
        found.update(hits)
    return found


def make_slots(model: Any, patterns: list[str], scaling: str | None) -> dict[str, np.ndarray]:
    """Turn the matching initializers of `model` into graph inputs (in place); returns slot -> default value.
    Inputs that already exist (exported as adapter inputs) default to zeros and must have fixed shapes."""
    import numpy as np

    from onnx import helper, numpy_helper
    from onnx.helper import tensor_dtype_to_np_dtype

    from ctxbuild.graph.modelio import graph_inputs

    inits = {t.name: t for t in model.graph.initializer}
    inputs = {i.name: i for i in graph_inputs(model)}
    slots = match_slots(patterns, list(inits), list(inputs))
    if scaling:
        slots.update(match_slots([scaling], list(inits), list(inputs), "scaling"))
    defaults: dict[str, np.ndarray] = {}
    for name, where in sorted(slots.items()):
        if where == "initializer":
            t = inits[name]
            defaults[name] = numpy_helper.to_array(t)
            model.graph.initializer.remove(t)
            model.graph.input.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
        else:
            tt = inputs[name].type.tensor_type
            dims = [d.dim_value for d in tt.shape.dim]
            if any(d <= 0 for d in dims):
                raise ActionError(f"adapters.slots: input '{name}' has a dynamic shape",
                                  f"fix it under `inputs:` in the recipe, e.g. {name}: [...]")
            defaults[name] = np.zeros(dims, tensor_dtype_to_np_dtype(tt.elem_type))
    return defaults


def add_defaults(model: Any, defaults: dict[str, np.ndarray]) -> None:
    """Add each slot's default as an initializer named like its graph input: the input becomes optional."""
    from onnx import numpy_helper

    have = {i.name for i in model.graph.input}
    for name, value in sorted(defaults.items()):
        if name not in have:
            raise ActionError(f"slot '{name}' is not an input of the compiled model",
                              "the compiler dropped it; check that the slot feeds the graph")
        model.graph.initializer.append(numpy_helper.from_array(value, name))


def slot_defaults(model: Any) -> dict[str, np.ndarray]:
    """Slot -> default value, from a model whose slots are graph inputs with an initializer of the same name."""
    from onnx import numpy_helper

    inputs = {i.name for i in model.graph.input}
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name in inputs}


def slot_defaults_of(path: Path) -> dict[str, np.ndarray]:
    """slot_defaults of a model file, reading only the slots' tensors from its external data (not every weight)."""
    import onnx

    from ctxbuild.graph.external_data import tensor_array

    model = onnx.load(str(path), load_external_data=False)
    inputs = {i.name for i in model.graph.input}
    return {t.name: tensor_array(t, path) for t in model.graph.initializer if t.name in inputs}


def slot_spec(defaults: dict[str, np.ndarray]) -> SlotSpec:
    return {k: (tuple(v.shape), v.dtype) for k, v in defaults.items()}


def wrapper_slot_spec(wrapper: Any) -> SlotSpec:
    """What an adapter file is bound against for a compiled wrapper: a slot it takes quantized
    (compile.quantized_io) is bound in float, then quantized with its encoding."""
    from ctxbuild.qnn.quantized_io import read_metadata

    encodings = read_metadata(wrapper)
    return slot_spec({k: v.astype("float32") if k in encodings else v for k, v in slot_defaults(wrapper).items()})


def read_file(path: Path) -> dict[str, np.ndarray]:
    """Tensor name -> array, from an .onnx_adapter, .safetensors or .npz file."""
    if not path.is_file():
        raise ActionError(f"{path}: adapter file not found")
    try:
        if path.suffix == ".onnx_adapter":
            return read_onnx_adapter(path)
        if path.suffix == ".safetensors":
            from safetensors.numpy import load_file

            return dict(load_file(str(path)))
    except Exception as e:  # noqa: BLE001 - each reader raises its own types for a corrupt file
        raise ActionError(f"{path}: cannot read adapter file: {cause_line(e, limit=200)}",
                          "re-export the adapter") from None
    if path.suffix == ".npz":
        return read_arrays(path, "adapter file")
    raise ActionError(f"{path}: unsupported adapter format", f"use one of {', '.join(FORMATS)}")


def read_onnx_adapter(path: Path) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    fmt = ort.AdapterFormat.read_adapter(str(path))
    # copies: the arrays view memory the format object owns, and it is freed with it
    return {k: v.numpy().copy() for k, v in fmt.get_parameters().items()}


def bind(path: Path, spec: SlotSpec, *, tensors: dict[str, str], scaling: str | None,
         scale: float | None) -> dict[str, np.ndarray]:
    """The adapter's value per slot, checked against the slots' shapes and dtypes.

    `tensors` maps names in the file to slot names (default: the same name); `scale`, when the recipe gives
    it, fills the `scaling` slot. Slots the file leaves out keep the base model's default."""
    import numpy as np

    raw = read_file(path)
    if not raw:
        raise ActionError(f"{path}: the adapter file holds no tensors")
    out: dict[str, np.ndarray] = {}
    for name, value in raw.items():
        slot = tensors.get(name, name)
        if slot not in spec:
            import difflib

            close = difflib.get_close_matches(slot, list(spec), n=1)
            raise ActionError(f"{path}: tensor '{name}' matches no adapter slot of the model",
                              f"did you mean '{close[0]}'? (or map it under `tensors:`)" if close else
                              f"slots: {', '.join(sorted(spec))}; map file names to slots under `tensors:`")
        shape, dtype = spec[slot]
        if tuple(value.shape) != shape:
            raise ActionError(f"{path}: tensor '{name}' has shape {list(value.shape)}, slot '{slot}' needs "
                              f"{list(shape)}", "the adapter was trained for another base model or rank")
        if not np.can_cast(value.dtype, dtype, casting="same_kind"):
            raise ActionError(f"{path}: tensor '{name}' is {value.dtype}, slot '{slot}' needs {dtype}")
        with np.errstate(over="ignore"):  # an overflow is reported by _finite, with the file's name
            out[slot] = _finite(path, f"tensor '{name}'", value, value.astype(dtype, copy=False))
    if scale is not None and scaling:
        shape, dtype = spec[scaling]
        with np.errstate(over="ignore"):
            out[scaling] = _finite(path, "scale", np.float64(scale), np.full(shape, scale, dtype))
    return out


def _finite(path: Path, what: str, given: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """NaN or Inf in an adapter would ship (verification is optional) and poison every output."""
    import numpy as np

    if not np.issubdtype(bound.dtype, np.floating) or np.isfinite(bound).all():
        return bound
    nan, inf = int(np.isnan(given).sum()), int(np.isinf(given).sum())
    if nan or inf:
        found = " and ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "infinite")) if n)
        raise ActionError(f"{path}: {what} holds {found} value{'s' if nan + inf > 1 else ''}",
                          "fix the adapter (a diverged training run?) or leave it out")
    raise ActionError(f"{path}: {what} has values beyond the range of {bound.dtype} (the slot's type; largest "
                      f"magnitude {float(np.abs(given).max()):g})", "rescale the adapter, or give the base model "
                                                                   "a wider type for its LoRA weights")


def write_onnx_adapter(path: Path, values: dict[str, np.ndarray]) -> None:
    """onnxruntime's adapter format: what `LoraAdapter().Load` + `RunOptions.add_active_adapter` bind."""
    import numpy as np

    import onnxruntime as ort

    arrays = {k: np.ascontiguousarray(v) for k, v in sorted(values.items())}  # OrtValues borrow this memory
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(1)
    fmt.set_model_version(1)
    fmt.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in arrays.items()})
    fmt.export_adapter(str(path))


def bind_param(path: Path, spec: SlotSpec, param: dict[str, Any]) -> dict[str, np.ndarray]:
    """`bind` with an action's per-adapter parameters ({format, tensors, scale, scaling})."""
    return bind(path, spec, tensors=dict(param["tensors"]), scaling=param["scaling"], scale=param["scale"])


class CalibrationSet:
    """Calibration over the declared adapters: each sample runs once with the base's defaults ("no
    adapter") and once per adapter of the set, so the activation encodings cover all of them. With switch: alpha,
    once with lora_alpha all zeros and once per one-hot: encodings then cover every adapter alone and their convex
    mixes (alphas summing to at most 1)."""

    def __init__(self, defaults: dict[str, np.ndarray], variants: list[dict[str, np.ndarray]]) -> None:
        self.defaults = defaults
        self.variants = variants

    @classmethod
    def of(cls, action: Any) -> "CalibrationSet | None":
        """From a quantize action's inputs (`reference`, `adapter:<name>`) and params; None without adapters."""
        params = action.params.get("adapters")
        if n := action.params.get("alpha"):  # switch: alpha: the base (all zeros) and each adapter alone (one-hot)
            import numpy as np

            defaults = slot_defaults_of(Path(action.inputs["reference"]))
            name = next(iter(defaults))
            return cls(defaults, [{name: np.eye(n, dtype=np.float32)[i]} for i in range(n)])
        if not params:
            return None
        defaults = slot_defaults_of(Path(action.inputs["reference"]))
        spec = slot_spec(defaults)
        variants = [bind_param(Path(action.inputs[f"adapter:{name}"]), spec, p)
                    for name, p in sorted(params.items())]
        return cls(defaults, variants)

    def data_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The model's inputs that samples provide (the slots come from the adapters)."""
        return {k: v for k, v in spec.items() if k not in self.defaults}

    def expand(self, samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return [{**s, **self.defaults, **v} for s in samples for v in [{}, *self.variants]]


def add_wrapper_defaults(wrapper: Path, reference: Path) -> None:
    """Give a compiled `_ctx.onnx` its slots' defaults (from the float reference): the inputs become optional.
    A slot the wrapper takes quantized (compile.quantized_io) gets its default quantized the same way."""
    import onnx

    from ctxbuild.qnn.quantized_io import quantize, read_metadata

    model = onnx.load(str(wrapper))
    encodings = read_metadata(model)
    defaults = {k: quantize(v, encodings[k]) if k in encodings else v
                for k, v in slot_defaults_of(reference).items()}
    add_defaults(model, defaults)
    onnx.save(model, str(wrapper))
