"""The `adapters:` block of a recipe (LoRA adapters over slots of the base model) and a prebuilt binary's
LoRAv2 sections (`prebuilt.adapters`), checked with file:line errors."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxbuild.lora.adapters import FORMATS
from ctxbuild.errors import RecipeError
from ctxbuild.recipes.yamlsrc import LineDict, line_of
from ctxbuild.recipes.paths import named_path

GROUPED = ("encodings", "weights")  # grouped LoRA: the two sections of one adapter, in the order they are applied


@dataclass(frozen=True)
class Adapter:
    name: str
    file: Path
    tensors: tuple[tuple[str, str], ...]  # name in the file -> slot
    scale: float | None  # value for the scaling slot


@dataclass(frozen=True)
class Adapters:
    slots: tuple[str, ...]  # names or glob patterns of initializers / graph inputs
    scaling: str | None
    items: tuple[Adapter, ...]
    calibrate: tuple[str, ...]  # adapter names the activation encodings are calibrated over

    def calibration_set(self) -> list[Adapter]:
        return [a for a in self.items if a.name in self.calibrate]


@dataclass(frozen=True)
class Sections:
    """LoRAv2 binary sections made elsewhere (QAIRT SDK) for a prebuilt base binary."""

    files: tuple[tuple[str, Path], ...]  # section -> file: `<adapter>`, or `<adapter>.encodings`/`.weights` (grouped)
    sdk_mismatch: str  # "error" | "warn"


def parse_adapters(f: Path, data: LineDict, spec: dict[str, Any], precision: str,
                   where: tuple[str, ...] = ("adapters",)) -> Adapters:
    """`where`: the block's path in the recipe (`llm:` recipes nest it: ("llm", "adapters"))."""
    def at(*path: str | int) -> str:
        return f"{f}:{line_of(data, [*where, *path])}"

    if "slots" not in spec:
        raise RecipeError(f"{at()}: adapters: `slots` is required (the base's LoRA weights that become inputs)",
                          "name them, e.g. slots: ['*lora_A', '*lora_B'], or set `switch: alpha` to attach the "
                          "adapters as branches switched by a lora_alpha input")
    if extra := next((k for k in ("input", "targets") if k in spec), None):
        raise RecipeError(f"{at(extra)}: adapters.{extra} belongs to `switch: alpha`", "add `switch: alpha` or remove it")
    if precision == "qdq":  # its LoRA weights are already quantized initializers behind DequantizeLinear
        raise RecipeError(f"{at()}: adapters need a float base model, not precision qdq",
                          "export the float model and use precision w8a16, w8a8, w16a16 or fp16")

    items = []
    for i, item in enumerate(spec["files"]):
        path = adapter_file(f, at, i, item)
        if "scale" in item and not math.isfinite(item["scale"]):
            raise RecipeError(f"{at('files', i, 'scale')}: adapter '{item['name']}': scale {item['scale']} is not "
                              "a finite number", "give a number such as 0.5 (YAML .nan and .inf are not)")
        if "scale" in item and not spec.get("scaling"):
            raise RecipeError(f"{at('files', i, 'scale')}: adapter '{item['name']}' sets `scale` but the recipe "
                              "has no `adapters.scaling` input", "name the model's scaling input or initializer")
        items.append(Adapter(item["name"], path, tuple(sorted(item.get("tensors", {}).items())), item.get("scale")))
    names = unique_names(at, [a.name for a in items])
    calibrate = spec.get("calibrate", names)
    for i, n in enumerate(calibrate):
        if n not in names:
            raise RecipeError(f"{at('calibrate', i)}: '{n}' is not an adapter of this recipe",
                              f"adapters: {', '.join(names)}")
    return Adapters(tuple(spec["slots"]), spec.get("scaling"), tuple(items), tuple(calibrate))


def adapter_file(f: Path, at: Any, i: int, item: dict[str, Any]) -> Path:
    """files[i]'s path, checked: an adapter format, and there. `at(*path)`: file:line of a field of the block."""
    path = named_path(f.parent, item["file"])
    if path.suffix not in FORMATS:
        raise RecipeError(f"{at('files', i, 'file')}: adapter '{item['name']}': '{item['file']}' is not an "
                          "adapter file", f"use one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise RecipeError(f"{at('files', i, 'file')}: adapter '{item['name']}': file '{item['file']}' not "
                          f"found (looked in {path})", "paths are relative to the recipe file")
    return path


def unique_names(at: Any, names: list[str]) -> list[str]:
    if dup := next((n for n in names if names.count(n) > 1), None):
        raise RecipeError(f"{at('files')}: adapter name '{dup}' appears twice", "adapter names must be unique")
    return names


def parse_sections(f: Path, data: LineDict, spec: dict[str, Any]) -> Sections:
    files = []
    for name, given in spec.get("adapters", {}).items():
        parts = [("", given)] if isinstance(given, str) else [(p, given[p]) for p in GROUPED]
        for part, rel in parts:
            where = f"{f}:{line_of(data, ['prebuilt', 'adapters', name, *([part] if part else [])])}"
            path = named_path(f.parent, rel)
            what = f"LoRAv2 section '{name}'" + (f" ({part})" if part else "")
            if not path.is_file():
                raise RecipeError(f"{where}: {what}: '{rel}' not found (looked in {path})",
                                  "paths are relative to the recipe file")
            if path.stat().st_size == 0:
                raise RecipeError(f"{where}: {what}: '{rel}' is empty",
                                  "re-export it with the QAIRT SDK (qnn-context-binary-generator --adapter_weight_config)")
            files.append((f"{name}.{part}" if part else name, path))
    return Sections(tuple(files), spec.get("sdk_mismatch", "error"))
