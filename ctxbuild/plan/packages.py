"""`package: true`: the actions writing a recipe's onnxruntime model package, OUT/packages/<recipe>/.

One component per graph (a single-graph recipe's is named for the recipe), one variant per deliverable: every
target of every toolchain variant of the recipe, named `<target>` for its first toolchain and
`<target>-qairt-X.Y.Z` for the others, declared in the recipe's order (onnxruntime picks the first among
variants the EP rates alike). Each deliverable's files are copied into one variant directory once its
verifications passed (package_variant); a bundle's directory holds every graph's wrapper beside the binary they
share and each graph's variant names that directory, so the binary is stored once. model_package writes
manifest.json over them.

onnxruntime's shared assets (`shared_assets/sha256-<digest>/`) are not used: their directory names are digests
of their contents, known only once the files exist, while every output of an action is named at plan time; and
a wrapper finds its binary only beside itself (an EPContext node's path admits no `..`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.layout import package_dir
from ctxbuild.plan import kinds
from ctxbuild.plan.action import Action
from ctxbuild.recipes.objects import Recipe


def package_actions(recipes: list[Recipe], actions: list[Action], out: Path) -> list[Action]:
    """The package_variant and model_package actions of every recipe with `package: true`."""
    made: list[Action] = []
    for name in dict.fromkeys(r.package for r in recipes if r.package):
        members = [r for r in recipes if r.package == name]  # the recipe's toolchain variants, in its order
        made += _package(name, members, actions, out)
    return made


def _package(name: str, members: list[Recipe], actions: list[Action], out: Path) -> list[Action]:
    by_name = {r.name: r for r in members}
    copies: list[Action] = []
    variants: list[dict[str, Any]] = []
    inputs: dict[str, str] = {}
    for d in actions:
        recipe = next((by_name[r] for r in d.recipes if r in by_name), None)
        if recipe is None or not kinds.get(d.kind).deliverable or not d.delivered(out):
            continue
        assert d.target is not None  # every deliverable a packaged recipe makes is built for a target
        variant = d.target["name"] + recipe.name[len(name):]  # "-qairt-2.47.0" after a toolchain variant's target
        results = _results(name, d, actions)
        copy = _copy(name, variant, d, recipe, results, out)
        copies.append(copy)
        wrappers = [role for role in copy.outputs if role.split(":")[0] == "ctx"]
        for role in wrappers:
            component = role.partition(":")[2] or name
            label = f"{component}@{variant}"
            inputs[f"model:{label}"] = copy.outputs[role]
            verified = {f"verified:{label}.{i}": r for i, r in enumerate(results.get(component, []))}
            inputs.update(verified)
            variants.append({"component": component, "variant": variant, "model": f"model:{label}",
                             "verified": list(verified), "target": d.target,
                             "toolchain": recipe.toolchain or "installed", "shares_context": len(wrappers) > 1})
    if not variants:
        return []
    files = list(dict.fromkeys(str(r.file) for r in members))
    manifest = Action(id=f"model_package/{name}", kind="model_package",
                      description=f"model package {name} ({len(variants)} variants)", inputs=inputs,
                      outputs={"package": str(package_dir(out, name) / "manifest.json")},
                      params={"name": name, "variants": variants}, recipes=[r.name for r in members],
                      recipe_files=files)
    return [*copies, manifest]


def _results(name: str, d: Action, actions: list[Action]) -> dict[str, list[str]]:
    """Component -> the verification results of deliverable `d`: the verifies reading its files, or `d` itself when
    it verified what it delivers (a precision search's select)."""
    files, single = set(d.outputs.values()), "ctx" in d.outputs
    found: dict[str, list[str]] = {}
    for v in actions:
        if v is d and kinds.get(d.kind).verification:
            graph, result = d.params["graphs"][0], d.outputs["result"]
        elif kinds.get(v.kind).verdict and files & set(v.inputs.values()):
            graph, result = v.params["graph"], v.outputs["result"]
        else:
            continue
        # one graph: its component is named for the package (the graph, for a toolchain variant's recipe name)
        found.setdefault(name if single else graph, []).append(result)
    return found


def _copy(name: str, variant: str, d: Action, recipe: Recipe, results: dict[str, list[str]], out: Path) -> Action:
    """package_variant: the deliverable's wrappers and binary into the variant directory, after its verifications."""
    files = {role: p for role, p in d.outputs.items() if role == "bin" or role.split(":")[0] == "ctx"}
    inputs = {f"file:{role}": p for role, p in files.items()}
    inputs.update({f"verified:{i}": r for i, r in enumerate(r for rs in results.values() for r in rs)})
    vdir = package_dir(out, name) / variant
    # no toolchain of its own (a copy needs none); model_package too: the installed onnxruntime writes the package
    return Action(id=f"package_variant/{name}@{variant}", kind="package_variant",
                  description=f"package {name}@{variant}", inputs=inputs,
                  outputs={role: str(vdir / Path(p).name) for role, p in files.items()},
                  params={"package": name, "variant": variant}, recipes=[recipe.name],
                  recipe_files=[str(recipe.file)], target=d.target)
