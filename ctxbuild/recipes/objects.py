"""The plain objects a recipe becomes: a Recipe (its graphs, targets, compile options, verification, quantization,
adapters, llm spec, toolchains) and the RecipeSet a load returns. recipe.py loads them, parse.py builds them."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxbuild.recipes.adapters import Adapters, Sections
from ctxbuild.recipes.alpha import AlphaSwitch
from ctxbuild.recipes.llm import LlmSpec
from ctxbuild.recipes.targets import Target


@dataclass(frozen=True)
class Calibration:
    dir: Path | None
    random: bool
    samples: int


@dataclass(frozen=True)
class CompileOptions:
    embed: bool = False
    optimization_mode: int | None = None
    vtcm_mb: int | None = None
    cpu_fallback: bool = False
    provider_options: tuple[tuple[str, str], ...] = ()
    split_outputs: bool | tuple[str, ...] = False  # see split_outputs.py
    quantized_io: bool = False  # see quantized_io.py


@dataclass(frozen=True)
class Graph:
    """One ONNX graph to compile: the recipe's model, or one member of a bundle."""

    name: str
    model: Path
    inputs: dict[str, tuple[int, ...]]
    calibration: Calibration | None
    outputs: tuple[str, ...] = ()  # `outputs:`: build only the part computing these tensors (graph/cut.py)
    # `input_values:`: inputs the app always sets to one value, made constants (graph/inputvalues.py)
    input_values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prebuilt:
    bin: Path
    graphs: tuple[str, ...]
    quantized_io: bool
    sections: Sections | None = None  # LoRAv2 adapter sections made elsewhere


@dataclass
class Recipe:
    name: str
    file: Path
    precision: str
    graphs: list[Graph]
    targets: list[Target]
    compile: CompileOptions
    is_bundle: bool = False
    multi_soc: bool = False
    verify: dict[str, Any] = field(default_factory=dict)
    prebuilt: Prebuilt | None = None
    # quantization.settings() dicts: one for a quantized precision (w8a16 ...), the ordered candidates for auto, none for fp16/qdq
    quantization: list[dict[str, Any]] = field(default_factory=list)
    adapters: Adapters | None = None
    alpha: AlphaSwitch | None = None  # adapters: {switch: alpha}: all resident, switched by the lora_alpha input
    runtimes: list[dict[str, str]] = field(default_factory=list)  # the fleet's runtimes: the deploy gate's
    llm: LlmSpec | None = None  # an `llm:` recipe (ctxbuild/llm/): its graphs are made by its own actions
    # The toolchains that build it (names; None: the installed one). load() makes one Recipe per toolchain.
    toolchains: list[str | None] = field(default_factory=lambda: [None])
    target_toolchains: dict[str, str | None] = field(default_factory=dict)  # targets whose group names one

    @property
    def toolchain(self) -> str | None:
        return self.toolchains[0]
    rewrite: bool | list[str] = True  # prepare.rewrite: the legalization rules (graph/legalize), all by default
    # precision: auto: a later target skips the candidates an earlier one measured failing (`auto: {siblings: false}`)
    search_siblings: bool = True
    # `package: true`: the model package's name (the recipe's own, which its toolchain variants share); None: none
    package: str | None = None


@dataclass
class RecipeSet:
    recipes: list[Recipe]
    files: list[Path]  # every YAML file read (recipes and defaults): the generator edge's inputs
    dirs: list[Path]  # every directory scanned: a new recipe file changes its mtime
    cache: dict[str, Any]  # merged `cache:` settings from defaults files
