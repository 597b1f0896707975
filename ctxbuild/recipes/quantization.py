"""Quantization settings: a recipe's `precision` shorthand and `quantization:` block -> the quantize action's params.

Everything here maps onto onnxruntime.quantization's `get_qnn_qdq_config` (activation/weight types, per_channel,
symmetry, calibrate_method, init_overrides) and StaticQuantConfig's extra_options (CalibPercentile): ctxbuild
chooses settings, onnxruntime quantizes.
"""
from __future__ import annotations

from typing import Any, Callable

from ctxbuild.errors import RecipeError
from ctxbuild.recipes import precisions
from ctxbuild.recipes.targets import Target

# Recipe dtype name -> onnxruntime.quantization.QuantType member.
QUANT_TYPES = {"uint8": "QUInt8", "uint16": "QUInt16", "int8": "QInt8", "int16": "QInt16"}
# No Entropy: onnxruntime's quantize() cannot pass it num_bins, and with its defaults (128 == num_quantized_bins)
# the KL search has one candidate, the full range: measured scales identical to MinMax on every tensor.
CALIBRATION_METHODS = {"minmax": "MinMax", "percentile": "Percentile"}
DEFAULT_PERCENTILE = 99.999  # onnxruntime's own default for CalibrationMethod.Percentile
# A quantized precision's settings (precisions.py, the table of names): w8a16 -> uint16 activations, uint8 weights
SHORTHANDS: dict[str, dict[str, Any]] = {p.name: {"activations": p.activations, "weights": p.weights}
                                         for p in precisions.TABLE if p.activations}
# precision: auto, cheapest on the device first. Measured on a public text recognizer (QNN-NOTES.md): per-tensor
# uint8 weights lose attention blocks, per-channel recovers most of it, 16-bit weights the rest at ~3.5x the cost.
# Named by label(): w8a16, w8a16-pc, w16a16 (a refining mapping shows in the names, e.g. w8a16-percentile).
DEFAULT_LADDER: list[dict[str, Any]] = [
    {"activations": "uint16", "weights": "uint8"},
    {"activations": "uint16", "weights": "uint8", "per_channel": True},
    {"activations": "uint16", "weights": "int16"},
]
# Measured with bench/quant_support.py (onnxruntime-qnn 2.7.0 / QNN 2.51, compile + simulator run per arch):
# int16 weights compile on v73, v75, v79, v81 and fail on v68/v69 (Conv: precisions.INT16_WEIGHTS_MIN_ARCH); int16
# weights with 8-bit activations, and uint16 (asymmetric 16-bit) weights, fail on every arch. The schema only
# offers uint8/uint16 activations.
# precision: auto's last rung: the float model compiled with enable_htp_fp16_precision. No quantize, no CPU screen;
# the largest binary, so it runs only when no integer candidate passed (a T5 encoder and decoder pass at fp16
# while every integer candidate misses). `auto: {fp16: false}` leaves it out.
# Its name is reserved (no quantization candidate may take it): the search's walk knows the rung by it.
FP16_RUNG: dict[str, Any] = {"name": "fp16", "precision": "fp16"}
# quantization.nodes' value for a node left out of quantization (onnxruntime's nodes_to_exclude): between the
# quantized nodes, the HTP runs it in fp16 (measured: a QDQ model with a float Sigmoid compiles and runs on v75).
FP16_NODE = "fp16"
# precision: auto's rung after the quantization candidates (unless `auto: {mixed: false}`): the first failed
# candidate with the nodes the per-node diagnosis blames kept at higher precision (quantization.nodes), decided
# by the search's `culprits` action when every candidate before it failed. Its name is reserved, as fp16's.
MIXED_RUNG: dict[str, Any] = {"name": "mixed", "precision": "mixed", "samples": None}


def is_fp16(s: dict[str, Any]) -> bool:
    """Whether a ladder entry is the fp16 rung (not quantized: no quantize, no screen)."""
    return s.get("precision") == "fp16"


def is_mixed(s: dict[str, Any]) -> bool:
    """Whether a ladder entry is the mixed rung (its settings are decided at build time)."""
    return s.get("precision") == "mixed"


def settings(block: dict[str, Any]) -> dict[str, Any]:
    """A full, canonical settings dict (what the quantize action's params hold) from a recipe block."""
    weights = block.get("weights", "uint8")
    method = block.get("calibration_method", "minmax")
    return {
        "activations": block.get("activations", "uint16"), "weights": weights,
        "per_channel": bool(block.get("per_channel", False)),
        "activation_symmetric": bool(block.get("activation_symmetric", False)),
        # onnxruntime's default: symmetric exactly when the weight type is signed
        "weight_symmetric": bool(block.get("weight_symmetric", weights.startswith("int"))),
        "calibration_method": method,
        "percentile": float(block.get("percentile", DEFAULT_PERCENTILE)) if method == "percentile" else None,
        "samples": block.get("samples"),  # None: the graph's calibration.samples
        "tensors": {k: dict(v) for k, v in sorted(block.get("tensors", {}).items())},
        "nodes": {k: v if v == FP16_NODE else dict(v) for k, v in sorted(block.get("nodes", {}).items())},
    }


def label(s: dict[str, Any]) -> str:
    """A short readable name for a settings dict, in the precisions' vocabulary: w8a16-pc, w16a16-percentile,
    w8a16-mixed (per-node precisions: what the search's mixed rung decides, pasted from its pin), ..."""
    parts = [precisions.name_of(s["activations"], s["weights"])]
    if s["per_channel"]:
        parts.append("pc")
    if s["calibration_method"] != "minmax":
        parts.append(s["calibration_method"])
    if s["nodes"]:
        parts.append("mixed")
    if s["tensors"]:
        parts.append("ovr")
    return "-".join(parts)


def describe(precision: str, s: dict[str, Any]) -> str:
    """The precision's name when `s` is just its shorthand, else the settings' label."""
    if is_mixed(s):
        return "mixed: nodes from the diagnosis"
    shorthand = {**settings(SHORTHANDS.get(precision, {})), "name": s.get("name")}
    return precision if precision in SHORTHANDS and {**s, "samples": None} == shorthand else label(s)


def problem(s: dict[str, Any], target: Target) -> str | None:
    """Why `target` cannot run these settings (measured, see precisions.INT16_WEIGHTS_MIN_ARCH), or None."""
    if is_fp16(s) or is_mixed(s):  # the mixed rung checks what it decides itself (culprits)
        return None
    least = precisions.INT16_WEIGHTS_MIN_ARCH
    old = [a for a in target.htp_arch.split(",") if int(a) < least]
    too_old = (f"int16 weights need HTP v{least} or newer; target {target.name} is v{', v'.join(old)}"
               if old else None)
    if s["weights"] == "int16":
        if s["activations"] != "uint16":
            return "int16 weights need uint16 activations (with 8-bit activations they fail to compile)"
        if too_old:
            return too_old
    for name, node in s["nodes"].items():
        if node != FP16_NODE and node.get("weights") == "int16":
            if node.get("activations", s["activations"]) != "uint16":
                return f"node '{name}': int16 weights need uint16 activations"
            if too_old:  # QNN refuses the node (error 3110), as it does the whole model's
                return f"node '{name}': {too_old}"
    return None


def from_recipe(precision: str, spec: Any, targets: list[Target], at: Callable[..., str],
                auto: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The recipe's quantization: one settings dict for a quantized precision (w8a16 ...), the ladder for auto (FP16_RUNG last unless
    `auto: {fp16: false}`), none otherwise. `at(*path)` gives `file:line` for a path under the recipe, for errors."""
    if auto is not None and precision != "auto":
        raise RecipeError(f"{at('auto')}: `auto` has no effect with precision {precision}",
                          "remove it, or set precision: auto")
    if precision not in SHORTHANDS and precision != "auto":
        if spec is not None:
            raise RecipeError(f"{at('quantization')}: `quantization` has no effect with precision {precision}",
                              f"remove it, or use precision {', '.join([*SHORTHANDS, 'auto'])}")
        return []
    if precision == "auto":
        if isinstance(spec, list):
            blocks = [(b, ("quantization", i)) for i, b in enumerate(spec)]
        else:  # a mapping refines every rung of the default ladder (e.g. a calibration method for all)
            blocks = [({**rung, **(spec or {})}, ("quantization",)) for rung in DEFAULT_LADDER]
    else:
        if isinstance(spec, list):
            raise RecipeError(f"{at('quantization')}: a list of quantization blocks is a ladder for precision: auto",
                              f"give one block (a mapping) with precision {precision}, or set precision: auto")
        blocks = [({**SHORTHANDS[precision], **(spec or {})}, ("quantization",))]
    ladder, names = [], set()
    for block, path in blocks:
        s = settings(block)
        _check_block(block, at(*path))
        name = block.get("name") or label(s)
        if name in names:
            raise RecipeError(f"{at(*path)}: two quantization candidates are both named '{name}'",
                              "give them distinct `name`s")
        names.add(name)
        if precision != "auto":  # a single scheme must run on every target; a ladder skips rungs per target
            for t in targets:
                why = problem(s, t)
                if why:
                    raise RecipeError(f"{at(*path, 'weights') if 'weights' in block else at(*path)}: {why}",
                                      "use weights: uint8 (per_channel: true recovers most of the accuracy), "
                                      "or drop the older targets")
        ladder.append({"name": name, **s})
    if precision == "auto":
        ladder += _rungs(auto or {}, names, at, {s["samples"] for s in ladder})
    return ladder


def _rungs(auto: dict[str, Any], names: set[str], at: Callable[..., str], samples: set[int | None]) -> list[dict[str, Any]]:
    """The rungs after the quantization candidates: mixed, then fp16 (each unless `auto` leaves it out).
    `samples`: the candidates' calibration sample counts (the mixed rung calibrates like them when they agree)."""
    rungs = []
    for rung, key in ((MIXED_RUNG, "mixed"), (FP16_RUNG, "fp16")):
        if not auto.get(key, True):
            continue
        if rung["name"] in names:
            raise RecipeError(f"{at('quantization')}: a quantization candidate is named '{rung['name']}', the name "
                              f"of the ladder's {key} rung", f"rename it, or set auto: {{{key}: false}}")
        rungs.append({**rung, "samples": samples.pop()} if key == "mixed" and len(samples) == 1 else dict(rung))
    return rungs


def _check_block(block: dict[str, Any], where: str) -> None:
    if "percentile" in block and block.get("calibration_method") != "percentile":
        raise RecipeError(f"{where}: `percentile` needs calibration_method: percentile",
                          "set calibration_method: percentile, or remove percentile")


def get_qnn_qdq_kwargs(s: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for get_qnn_qdq_config (the tensor overrides are added by the quantize action,
    which can see the model's node names)."""
    from onnxruntime.quantization import CalibrationMethod, QuantType

    return {"activation_type": getattr(QuantType, QUANT_TYPES[s["activations"]]),
            "weight_type": getattr(QuantType, QUANT_TYPES[s["weights"]]),
            "per_channel": s["per_channel"], "activation_symmetric": s["activation_symmetric"],
            "weight_symmetric": s["weight_symmetric"],
            "calibrate_method": getattr(CalibrationMethod, CALIBRATION_METHODS[s["calibration_method"]])}
