"""Recipes: discover the YAML files, merge directory defaults, validate them against the JSON Schema (errors naming
file, line and field), and hand each recipe to parse.py; load() returns the RecipeSet."""
from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ctxbuild.errors import RecipeError
from ctxbuild.layout import STATE
from ctxbuild.recipes import precisions, toolchains
from ctxbuild.recipes.objects import Recipe, RecipeSet
from ctxbuild.recipes.parse import parse_recipe, parse_runtimes
from ctxbuild.recipes.suggest import did_you_mean
from ctxbuild.recipes.yamlsrc import line_of, load_mapping

DEFAULTS_FILE = "_defaults.yaml"
SCHEMA_PATH = Path(__file__).with_name("recipe.schema.json")


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """recipe.schema.json completed: the legalization rules' names (prepare.rewrite) come from the rules
    themselves, so adding a rule touches its module and RULES (or FP16_RULES) only; the precisions' from their table."""
    from ctxbuild.graph.legalize import FP16_RULES, RULES

    loaded = json.loads(SCHEMA_PATH.read_text())
    loaded["$defs"]["rule"]["enum"] = [r.NAME for r in RULES + FP16_RULES]
    loaded["properties"]["precision"]["enum"] = precisions.spellings()  # precisions.py: the one table of names
    loaded["$defs"]["llm"]["properties"]["precision"]["enum"] = precisions.spellings(llm=True)
    return loaded


def load(paths: list[Path]) -> RecipeSet:
    """Load every recipe under `paths` (files or directories)."""
    files: list[Path] = []
    dirs: list[Path] = []
    recipe_files: list[tuple[Path, Path]] = []  # (recipe file, root it was found under)
    for p in dict.fromkeys(p.resolve() for p in paths):  # a directory given twice is read once
        if p.is_dir():
            root = p.resolve()
            for d in _recipe_dirs(root):
                dirs.append(d)
                for f in sorted(d.iterdir()):
                    if f.suffix in (".yaml", ".yml") and f.name != DEFAULTS_FILE and f.is_file():
                        recipe_files.append((f, root))
        elif p.is_file():
            recipe_files.append((p, p.parent))
        else:
            raise RecipeError(f"{p}: no such file or directory", "give recipe files or directories")
    if not recipe_files:
        raise RecipeError(f"no recipes (*.yaml) found under {', '.join(map(str, paths))}")

    defaults_cache: dict[Path, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {}
    recipes: list[Recipe] = []
    cache_settings: dict[str, Any] = {}
    seen: dict[str, Path] = {}
    unique: dict[Path, Path] = {}  # a file given and also found under a directory given: read once
    for f, root in recipe_files:
        unique.setdefault(f, root)
    for f, root in unique.items():
        defaults, groups, cache = _defaults_for(f.parent, root, defaults_cache, files)
        cache_settings.update(cache)
        files.append(f)
        loaded = _load_recipe(f, defaults, groups)
        for i, (tc, targets) in enumerate(toolchains.variants(loaded.toolchains, loaded.targets, loaded.target_toolchains)):
            name = toolchains.variant_name(loaded.name, tc, i == 0)
            # A single-graph recipe's graph is named for the recipe: the variant's too (labels, summaries).
            graphs = [replace(g, name=name) if g.name == loaded.name and not loaded.is_bundle else g for g in loaded.graphs]
            recipe = replace(loaded, name=name, graphs=graphs, targets=targets, toolchains=[tc], target_toolchains={})
            if recipe.multi_soc and len(targets) != len(loaded.targets):
                raise RecipeError(f"{f}:1: multi_soc: the recipe's targets are built with different toolchains "
                                  "(a target group names its own)", "build one flexible binary per toolchain: one recipe each")
            if recipe.name in seen:
                raise RecipeError(f"{f}:1: recipe name '{recipe.name}' is already used by {seen[recipe.name]}",
                                  "recipe names must be unique across the tree; set `name:` in one of them")
            seen[recipe.name] = f
            recipes.append(recipe)
    return RecipeSet(recipes, sorted(set(files)), dirs, cache_settings)


def _recipe_dirs(root: Path) -> list[Path]:
    """`root` and the directories below it, sorted, without hidden ones and without ctxbuild output
    directories (those holding OUT's state dir: OUT may live inside a recipe directory)."""
    found = []
    for d, subdirs, _ in os.walk(root):
        subdirs[:] = [s for s in subdirs if not s.startswith(".") and not os.path.isdir(os.path.join(d, s, STATE))]
        found.append(Path(d))
    return sorted(found)


def _defaults_for(directory: Path, root: Path, memo: dict, files: list[Path]
                  ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Merged (defaults, target_groups, cache) from `_defaults.yaml` files from `root` down to `directory`."""
    if directory in memo:
        return memo[directory]
    if directory == root or root not in directory.parents:
        parent: tuple[dict, dict, dict] = ({}, {}, {})
    else:
        parent = _defaults_for(directory.parent, root, memo, files)
    defaults, groups, cache = copy.deepcopy(parent[0]), dict(parent[1]), dict(parent[2])
    f = directory / DEFAULTS_FILE
    if os.path.lexists(f) and not f.is_file():  # a dangling or looping link once dropped the fleet's defaults silently
        what = "a directory" if f.is_dir() else "a symbolic link to nothing readable (dangling or a loop)" \
            if f.is_symlink() else "not a regular file"
        raise RecipeError(f"{f}:1: {DEFAULTS_FILE} is {what}", "point it at the defaults file, or remove it")
    if f.is_file():
        files.append(f)
        data = load_mapping(f)
        _validate(f, data, schema()["$defs"]["defaults_file"])
        if "defaults" in data:
            _validate(f, data["defaults"], _partial_recipe_schema(), prefix=["defaults"], root=data)
            defaults = _merge(defaults, data["defaults"])
            parse_runtimes(f, data, data["defaults"], ("defaults",))
            for key in ("model",):
                if key in data["defaults"]:
                    raise RecipeError(f"{f}:{line_of(data, ['defaults', key])}: `{key}` cannot be a default",
                                      "set it in each recipe")
        for g, spec in data.get("target_groups", {}).items():
            members, at = (spec["targets"], ["target_groups", g, "targets"]) if isinstance(spec, dict) else (spec, ["target_groups", g])
            tc = ((spec["toolchain"], f"{f}:{line_of(data, ['target_groups', g, 'toolchain'])}: target_groups.{g}.toolchain")
                  if isinstance(spec, dict) and "toolchain" in spec else None)
            groups[g] = [(m, f, line_of(data, [*at, i]), tc) for i, m in enumerate(members)]
        cache.update(data.get("cache", {}))
        if "@" in str(data.get("cache", {}).get("remote", "")).partition("://")[2].partition("/")[0]:
            # Never shown: the message names the field, not the URL.
            raise RecipeError(f"{f}:{line_of(data, ['cache', 'remote'])}: cache.remote holds credentials "
                              "(user:password@); a defaults file travels with the recipes, credentials may not",
                              "remove them and put them in ~/.netrc (machine HOST login USER password ...), or "
                              "a bearer token in the variable cache.token_env names ($CTXBUILD_REMOTE_TOKEN)")
        if "executor" in data:  # rides with the cache settings: the remote cache is the executor's data plane
            cache["executor"] = data["executor"]
    memo[directory] = (defaults, groups, cache)
    return memo[directory]


def _partial_recipe_schema() -> dict[str, Any]:
    s = dict(schema())
    s.pop("$id", None)
    return s


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge mappings (recipe keys win); lists and scalars are replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _validate(f: Path, data: Any, sch: dict[str, Any], prefix: list[str | int] | None = None,
              root: Any = None) -> None:
    import jsonschema  # imported lazily: only planning needs it, not the no-op fast path

    full = {**sch, "$defs": schema()["$defs"]}
    validator = jsonschema.Draft202012Validator(full)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if not errors:
        return
    err = errors[0]
    # oneOf hides the useful message in its context, nested as deep as the schema's oneOfs: the branch the value
    # got into says what is wrong inside it (an unknown key, a wrong value under a key); when the value fits no
    # branch at all, what each branch takes is the message.
    described = hint = None
    while err.context:
        inside = [e for e in err.context if len(e.absolute_path) > len(err.absolute_path)
                  or e.validator not in _ALTERNATIVE]
        if not inside:
            wants = [_wanted(e) for e in err.context]
            described = f"expected {' or '.join(dict.fromkeys(wants))}, got {_yaml_type(err.instance)} {err.instance!r}"
            consts = [str(e.validator_value) for e in err.context if e.validator == "const"]
            hint = did_you_mean(str(err.instance), consts) if consts and isinstance(err.instance, str) else None
            hint = hint or _dir_hint(err.instance, [e.schema for e in err.context])
            break
        err = max(inside, key=lambda e: len(e.absolute_path))
    path = (prefix or []) + list(err.absolute_path)
    unknown = sorted(set(err.instance) - set(err.schema.get("properties", {}))) \
        if err.validator == "additionalProperties" else []
    line = line_of(root if root is not None else data, path + unknown[:1])  # an unknown key: its own line
    where = ".".join(str(p) for p in path) or "(top level)"
    raise RecipeError(f"{f}:{line}: {where}: {described or _describe(err)}", hint if described else _hint(err))


_YAML_TYPES = {"object": "mapping", "array": "list"}  # JSON Schema's names, as a YAML author knows them
_ALTERNATIVE = frozenset({"type", "const", "enum"})  # a oneOf branch the value is not, rather than one it breaks


def _wanted(err: Any) -> str:
    """What a oneOf branch the value did not fit takes: a type (a mapping's few keys named), a constant or a choice."""
    if err.validator == "const":
        return repr(err.validator_value)
    if err.validator == "enum":
        return "one of " + ", ".join(map(str, err.validator_value))
    want = _type_names(err.validator_value)
    keys = sorted(err.schema.get("properties", {}))
    return f"mapping ({', '.join(keys)})" if want == "mapping" and 0 < len(keys) <= 4 else want  # more would crowd the line


def _type_names(types: str | list[str]) -> str:
    """A schema's `type` (one name or a list of them) as a YAML author knows them: `number or boolean`."""
    return " or ".join(_YAML_TYPES.get(t, t) for t in ([types] if isinstance(types, str) else types))


def _yaml_type(value: Any) -> str:
    return "mapping" if isinstance(value, dict) else "list" if isinstance(value, list) else type(value).__name__


def _describe(err: Any) -> str:
    v = err.validator
    if v == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return f"unknown key '{extra[0]}'" if extra else err.message
    if v == "type":
        expected = _type_names(err.validator_value)
        return f"expected {expected}, got {_yaml_type(err.instance)} {err.instance!r}"
    if v == "enum" and list(err.absolute_path)[-1:] == ["precision"]:  # the table's names, not every alias
        return f"{err.instance!r} is not one of {', '.join(precisions.names(llm=list(err.absolute_path)[:1] == ['llm']))}"
    if v == "enum":
        return f"{err.instance!r} is not one of {', '.join(map(str, err.validator_value))}"
    if v == "required":
        return err.message.replace("is a required property", "is required")
    if v == "pattern":
        return f"{err.instance!r} is not a valid name (letters, digits, . _ + -; no path separators)"
    return err.message


def _hint(err: Any) -> str | None:
    if err.validator == "additionalProperties":
        known = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(known))
        if extra and (nested := _undotted(extra[0], err.instance[extra[0]], known)):
            return nested
        keys = list(err.instance)
        before = keys[keys.index(extra[0]) - 1] if extra and keys.index(extra[0]) else None
        if before in known and err.instance[before] is None:  # `inputs:` with its entry not indented under it
            return f"indent it under `{before}:` (the key before it, which holds nothing)"
        otherwise = f"known keys: {', '.join(known)}"
        return did_you_mean(extra[0], known, otherwise=otherwise) if extra else otherwise
    if err.validator == "enum" and list(err.absolute_path)[-1:] == ["precision"]:
        return precisions.hint(err.instance, llm=list(err.absolute_path)[:1] == ["llm"])
    if err.validator == "enum":
        return did_you_mean(str(err.instance), [str(x) for x in err.validator_value])
    if err.validator == "type" and err.validator_value == "object" and (found := _dir_hint(err.instance, [err.schema])):
        return found
    if err.validator == "type" and err.validator_value == "string" and isinstance(err.instance, float):
        return 'quote it, e.g. "2.50": YAML reads 2.50 as the number 2.5'
    if err.validator == "type" and err.validator_value == "array" and type(err.instance) in (str, int, float):
        return f"write it as a list: [{err.instance}]"
    if err.validator == "type" and err.validator_value == "string" and type(err.instance) is int:  # a numbered name
        return f"quote it: '{err.instance}' (YAML reads {err.instance} unquoted as a number)"
    if err.validator == "type" and err.validator_value == "string" and isinstance(err.instance, bool):
        return "quote it, e.g. 'on': YAML reads on/off/yes/no/true/false unquoted as a boolean"
    return None


def _undotted(key: str, value: Any, known: list[str]) -> str | None:
    """`compile.split_outputs: true`, a hint's field path pasted as a key: the nested YAML to write instead."""
    import json

    import yaml

    head, *rest = key.split(".")
    if not rest or head not in known:
        return None
    nested: Any = json.loads(json.dumps(value, default=str))
    for part in reversed(rest):
        nested = {part: nested}
    line = yaml.safe_dump({head: nested}, default_flow_style=True, width=1 << 16).strip()[1:-1]
    return f"YAML does not nest by dots: write {line} (in the recipe's {head}: if it has one)"


def _dir_hint(value: Any, schemas: list[dict[str, Any]]) -> str | None:
    """`calibration: samples/` (or `verify:`): the directory alone, where a mapping with `dir` belongs."""
    if isinstance(value, str) and any("dir" in sch.get("properties", {}) for sch in schemas):
        return f"write it as a mapping: {{dir: {value}}}"
    return None


def _load_recipe(f: Path, defaults: dict[str, Any], groups: dict[str, list]) -> Recipe:
    data = load_mapping(f)
    _validate(f, data, _partial_recipe_schema())
    return parse_recipe(f, data, _merge(defaults, data), groups)
