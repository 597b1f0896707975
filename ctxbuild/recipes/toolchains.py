"""`toolchain:` in a recipe or defaults: which toolchains build it (toolchain/choose.py), checked by version
for what each can build. Several toolchains make one recipe variant each: the first keeps the recipe's name,
every further one is `<name>-qairt-X.Y.Z`, so outputs never collide. A target group may name its own
toolchain (a fleet on an older runtime): its targets then form the variant of that toolchain."""
from __future__ import annotations

from typing import Any

from ctxbuild.errors import RecipeError, UsageError
from ctxbuild.recipes.yamlsrc import LineDict, line_of
from ctxbuild.recipes.targets import Target
from ctxbuild.toolchain.choose import INSTALLED, by_name, choose
from ctxbuild.toolchain.installed import version
from ctxbuild.toolchain.runtimes import PUBLISHED

# The oldest onnxruntime-qnn release that builds each feature, and what the older ones do instead (measured by
# bench/toolchain_capabilities.py, table in docs/deploy.md). Weight-shared bundles (and so `llm:` recipes), LoRA
# adapters and quantized I/O are not listed: every published release builds them.
# feature -> (oldest release, what an older one does, what the user can do instead)
MIN_QNN_EP = {
    "multi_soc": ("2.5.0", "ignores the SoC list and writes a plain binary for the first SoC only (measured)",
                  "build one binary per SoC (drop `multi_soc`)"),
}


def parse(f: Any, data: LineDict, merged: dict[str, Any], by_group: dict[str, tuple[Any, str]],
          features: dict[str, str | None]) -> dict[str, Any]:
    """Recipe fields: `toolchains`, the toolchains (names; None: the installed one) the recipe names, in its
    order, without repeats; `target_toolchains`, per target whose target group names a toolchain (`by_group`:
    target -> (spec, where)), that one. `features`: what the recipe uses that needs a minimum release, with
    where it says so (None: not used)."""
    specs = merged.get("toolchain", INSTALLED)
    own = "toolchain" in data  # a line in the recipe, else the defaults file's value (line 1 of the recipe)
    listed = own and isinstance(data["toolchain"], list)
    chosen: list[str | None] = []
    for i, spec in enumerate(specs if isinstance(specs, list) else [specs]):
        where = f"{f}:{line_of(data, ['toolchain', i] if listed else ['toolchain'] if own else [])}: toolchain"
        name = _resolve(spec, where, features, named=own)
        if name not in chosen:
            chosen.append(name)
    return {"toolchains": chosen,
            "target_toolchains": {t: _resolve(spec, where, features, named=True) for t, (spec, where) in by_group.items()}}


def _resolve(spec: Any, where: str, features: dict[str, str | None], named: bool) -> str | None:
    """A toolchain's name (None: installed). A feature it cannot build is reported at the toolchain's line if the
    recipe or a target group `named` it, else at the feature's own line."""
    installed = version("onnxruntime-qnn")
    try:
        tc = choose(spec, where, installed)
    except UsageError as e:
        raise RecipeError(e.message, e.hint) from None
    plugin = tc.plugin if tc is not None else installed
    for feature, used_at in features.items():
        oldest, why, instead = MIN_QNN_EP[feature]
        if used_at is not None and _version_tuple(plugin) < _version_tuple(oldest):
            raise RecipeError(f"{where if named else used_at}: {feature} needs onnxruntime-qnn {oldest} or newer: "
                              f"{plugin} (QAIRT {PUBLISHED.get(plugin, '?')}) {why}",
                              f"{instead}, or choose a toolchain from {oldest} on (`toolchain: \"{oldest}\"`)")
    return tc.name if tc is not None else None


def variants(recipe_toolchains: list[str | None], targets: list[Target],
             by_target: dict[str, str | None]) -> list[tuple[str | None, list[Target]]]:
    """(toolchain, targets) per variant: the recipe's toolchains over the targets no group assigns, then each
    group-assigned toolchain over its targets; one variant per toolchain, in that order."""
    out: dict[str | None, list[Target]] = {}
    rest = [t for t in targets if t.name not in by_target]
    for tc in recipe_toolchains if rest else []:
        out.setdefault(tc, []).extend(rest)
    for t in targets:
        if t.name in by_target:
            out.setdefault(by_target[t.name], []).append(t)
    return list(out.items())


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
