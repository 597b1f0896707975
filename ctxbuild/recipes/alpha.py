"""`adapters: {switch: alpha, ...}`: LoRA adapters resident in one binary, switched per run by a `lora_alpha` input
(onnxruntime-qnn's LoRA v3 "hot switch"), checked with file:line errors. The graph side is ctxbuild/lora/alpha.py."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxbuild.errors import RecipeError
from ctxbuild.recipes.adapters import adapter_file, unique_names
from ctxbuild.recipes.yamlsrc import LineDict, line_of

# fields of the `.onnx_adapter` form (slots bound at run time) that mean nothing when alpha switches
SLOT_FIELDS = ("slots", "scaling", "calibrate")


@dataclass(frozen=True)
class AlphaAdapter:
    name: str
    file: Path
    tensors: tuple[tuple[str, str], ...]  # name in the file -> `<module>.lora_A` / `<module>.lora_B`
    scale: float  # the branch's multiplier (PEFT: lora_alpha / r); lora_alpha[i] scales it per run


@dataclass(frozen=True)
class AlphaSwitch:
    input: str  # the graph input: one float per adapter, 0.0 (off) to 1.0 (on)
    items: tuple[AlphaAdapter, ...]  # alpha index = position
    targets: tuple[tuple[str, str], ...]  # module named in the files -> MatMul/Gemm/Conv node of the model

    def param(self) -> dict[str, Any]:
        """What prepare needs to attach the branches (keyed: a change re-prepares, re-quantizes, recompiles)."""
        return {"input": self.input, "targets": dict(self.targets),
                "adapters": [{"name": a.name, "format": a.file.suffix, "tensors": dict(a.tensors), "scale": a.scale}
                             for a in self.items]}

    def files(self) -> dict[str, str]:
        return {f"alpha:{a.name}": str(a.file) for a in self.items}


def is_alpha(spec: dict[str, Any]) -> bool:
    return spec.get("switch") == "alpha"


def parse_alpha(f: Path, data: LineDict, spec: dict[str, Any], precision: str, *, bundle: bool, multi_soc: bool,
                where: tuple[str, ...] = ("adapters",)) -> AlphaSwitch:
    def at(*path: str | int) -> str:
        return f"{f}:{line_of(data, [*where, *path])}"

    if extra := next((k for k in SLOT_FIELDS if k in spec), None):
        raise RecipeError(f"{at(extra)}: adapters.{extra} belongs to adapters bound as .onnx_adapter, not to "
                          "switch: alpha", f"remove `{extra}` (every adapter is resident and calibrated), or drop "
                                           "`switch: alpha`")
    if precision in ("qdq", "auto"):
        raise RecipeError(f"{at('switch')}: switch: alpha needs a float base model and a fixed precision, not "
                          f"precision {precision}", "use precision w8a16, w8a8, w16a16 or fp16")
    if bundle or multi_soc:
        raise RecipeError(f"{at('switch')}: switch: alpha is built for single-graph recipes "
                          f"({'bundle' if bundle else 'multi_soc'} is not supported with it yet)",
                          "build the alpha-switched graph in its own recipe")
    items = []
    for i, item in enumerate(spec["files"]):
        path = adapter_file(f, at, i, item)
        scale = item.get("scale", 1.0)
        if not math.isfinite(scale):
            raise RecipeError(f"{at('files', i, 'scale')}: adapter '{item['name']}': scale {scale} is not a finite "
                              "number", "give the adapter's lora_alpha / r, e.g. 2.0")
        items.append(AlphaAdapter(item["name"], path, tuple(sorted(item.get("tensors", {}).items())), float(scale)))
    unique_names(at, [a.name for a in items])
    return AlphaSwitch(spec.get("input", "lora_alpha"), tuple(items), tuple(sorted(spec.get("targets", {}).items())))
