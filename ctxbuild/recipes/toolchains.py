"""`toolchain:` in a recipe or defaults: which toolchains build it (toolchain/choose.py), checked by version
for what each can build. Several toolchains make one recipe variant each: the first keeps the recipe's name,
every further one is `<name>-qairt-X.Y.Z`, so outputs never collide."""
from __future__ import annotations

from typing import Any

from ctxbuild.errors import RecipeError, UsageError
from ctxbuild.recipes.yamlsrc import LineDict, line_of
from ctxbuild.toolchain.choose import by_name, choose
from ctxbuild.toolchain.installed import version
from ctxbuild.toolchain.runtimes import PUBLISHED

MIN_QNN_EP = {"bundle": (2, 7), "multi_soc": (2, 7)}  # onnxruntime-qnn releases that can build these


def parse(f: Any, data: LineDict, merged: dict[str, Any], features: dict[str, bool]) -> list[str | None]:
    """The toolchains (names; None: the installed one) a recipe is built with, in its order, without repeats.
    `features`: what the recipe uses that needs a minimum release (bundle, multi_soc)."""
    specs = merged.get("toolchain", "installed")
    own = "toolchain" in data  # a line in the recipe, else the defaults file's value (line 1 of the recipe)
    specs = specs if isinstance(specs, list) else [specs]
    installed = version("onnxruntime-qnn")
    chosen: list[str | None] = []
    for i, spec in enumerate(specs):
        where = f"{f}:{line_of(data, ['toolchain', i] if own and isinstance(data['toolchain'], list) else ['toolchain'] if own else [])}"
        try:
            tc = choose(spec, f"{where}: toolchain", installed)
        except UsageError as e:
            raise RecipeError(e.message, e.hint) from None
        name = tc.name if tc is not None else None
        plugin = tc.plugin if tc is not None else installed
        for feature, wanted in features.items():
            need = MIN_QNN_EP[feature]
            if wanted and _version_tuple(plugin) < need:
                raise RecipeError(f"{where}: {feature} needs onnxruntime-qnn >= {'.'.join(map(str, need))}; "
                                  f"toolchain {spec!r} is onnxruntime-qnn {plugin}",
                                  "choose a newer toolchain for this recipe, or build its graphs one by one")
        if name not in chosen:
            chosen.append(name)
    return chosen


def variant_name(recipe_name: str, toolchain: str | None, first: bool) -> str:
    if first:
        return recipe_name
    if toolchain is not None:
        return f"{recipe_name}-{by_name(toolchain).suffix}"
    installed = version("onnxruntime-qnn")
    return f"{recipe_name}-qairt-{PUBLISHED.get(installed, installed)}"


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
