"""Recipes: discover YAML files, merge directory defaults, validate, and turn them into plain Recipe objects."""
from __future__ import annotations

import copy
import json
import os
import stat
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ctxbuild.recipes import quantization as quant
from ctxbuild.recipes import targets as soc_table
from ctxbuild.errors import RecipeError, UsageError
from ctxbuild.layout import STATE
from ctxbuild.recipes.suggest import did_you_mean
from ctxbuild.recipes.adapters import Adapters, Sections, parse_adapters, parse_sections
from ctxbuild.recipes.llm import LlmSpec, parse_llm
from ctxbuild.recipes.targets import Target
from ctxbuild.recipes import toolchains
from ctxbuild.recipes.yamlsrc import LineDict, line_of, load_mapping
from ctxbuild.layout import OUT_FILES
from ctxbuild.recipes.paths import named_path
from ctxbuild.graph.signature import quantize_nodes

DEFAULTS_FILE = "_defaults.yaml"
SCHEMA_PATH = Path(__file__).with_name("recipe.schema.json")
PRECISIONS = ("int16", "int8", "fp16", "qdq", "auto")


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
    # quantization.settings() dicts: one for int16/int8, the ordered candidates for auto, none for fp16/qdq
    quantization: list[dict[str, Any]] = field(default_factory=list)
    adapters: Adapters | None = None
    runtimes: list[dict[str, str]] = field(default_factory=list)  # the fleet's runtimes: the deploy gate's
    llm: LlmSpec | None = None  # an `llm:` recipe (ctxbuild/llm/): its graphs are made by its own actions
    # The toolchains that build it (names; None: the installed one). load() makes one Recipe per toolchain.
    toolchains: list[str | None] = field(default_factory=lambda: [None])
    target_toolchains: dict[str, str | None] = field(default_factory=dict)  # targets whose group names one

    @property
    def toolchain(self) -> str | None:
        return self.toolchains[0]
    rewrite: bool | list[str] = True  # prepare.rewrite: the legalization rules (graph/legalize), all by default


@dataclass
class RecipeSet:
    recipes: list[Recipe]
    files: list[Path]  # every YAML file read (recipes and defaults): the generator edge's inputs
    dirs: list[Path]  # every directory scanned: a new recipe file changes its mtime
    cache: dict[str, Any]  # merged `cache:` settings from defaults files


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


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
    if f.is_file():
        files.append(f)
        data = load_mapping(f)
        _validate(f, data, schema()["$defs"]["defaults_file"])
        if "defaults" in data:
            _validate(f, data["defaults"], _partial_recipe_schema(), prefix=["defaults"], root=data)
            defaults = _merge(defaults, data["defaults"])
            _runtimes(f, data, data["defaults"], ("defaults",))
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
    # oneOf hides the useful message in its context: the branch of the value's own type says what is wrong
    # inside it (an unknown key in a mapping); when no branch has its type, all their types are the message.
    described = None
    if err.context:
        inside = [e for e in err.context if e.validator != "type"]
        if inside:
            err = max(inside, key=lambda e: len(e.absolute_path))
        else:
            expected = " or ".join(dict.fromkeys(_YAML_TYPES.get(e.validator_value, e.validator_value)
                                                 for e in err.context))
            described = f"expected {expected}, got {_yaml_type(err.instance)} {err.instance!r}"
    path = (prefix or []) + list(err.absolute_path)
    unknown = sorted(set(err.instance) - set(err.schema.get("properties", {}))) \
        if err.validator == "additionalProperties" else []
    line = line_of(root if root is not None else data, path + unknown[:1])  # an unknown key: its own line
    where = ".".join(str(p) for p in path) or "(top level)"
    raise RecipeError(f"{f}:{line}: {where}: {described or _describe(err)}", _hint(err))


_YAML_TYPES = {"object": "mapping", "array": "list"}  # JSON Schema's names, as a YAML author knows them


def _yaml_type(value: Any) -> str:
    return "mapping" if isinstance(value, dict) else "list" if isinstance(value, list) else type(value).__name__


def _describe(err: Any) -> str:
    v = err.validator
    if v == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return f"unknown key '{extra[0]}'" if extra else err.message
    if v == "type":
        expected = _YAML_TYPES.get(err.validator_value, err.validator_value)
        return f"expected {expected}, got {_yaml_type(err.instance)} {err.instance!r}"
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
        otherwise = f"known keys: {', '.join(known)}"
        return did_you_mean(extra[0], known, otherwise=otherwise) if extra else otherwise
    if err.validator == "enum":
        return did_you_mean(str(err.instance), [str(x) for x in err.validator_value])
    if err.validator == "type" and err.validator_value == "string" and isinstance(err.instance, float):
        return 'quote it, e.g. "2.50": YAML reads 2.50 as the number 2.5'
    return None


def _load_recipe(f: Path, defaults: dict[str, Any], groups: dict[str, list]) -> Recipe:
    data = load_mapping(f)
    _validate(f, data, _partial_recipe_schema())
    merged = _merge(defaults, data)

    def at(*path: str | int) -> str:
        return f"{f}:{line_of(data, list(path))}"

    name = merged.get("name", f.stem)
    if not soc_table.is_safe_name(name):
        raise RecipeError(f"{at('name')}: recipe name '{name}' cannot be used as a directory name under OUT",
                          "use letters, digits, . _ + - (no '/', no '..')")
    sources = [k for k in ("model", "bundle", "prebuilt", "llm") if k in merged]
    if len(sources) > 1:
        raise RecipeError(f"{at(sources[1])}: a recipe has one of `model`, `bundle`, `prebuilt` or `llm`, not "
                          f"{' and '.join(sources)}")
    if not sources:
        raise RecipeError(f"{at()}: `model` is required", "the ONNX file, relative to this recipe "
                          "(or `bundle:` graphs, or a `prebuilt:` context binary)")
    if "targets" not in merged:
        raise RecipeError(f"{at()}: `targets` is required", "e.g. targets: [SM8650, SM8750]")
    if "prebuilt" in merged:
        return _prebuilt_recipe(f, data, name, merged, groups)
    if "llm" in merged:
        return _llm_recipe(f, data, name, merged, groups)
    precision = merged.get("precision")
    if precision is None:
        raise RecipeError(f"{at()}: `precision` is required", f"one of {', '.join(PRECISIONS)}")
    if "bundle" in merged:
        # A graph's own calibration wins; the recipe's (or the directory default's) is its default.
        graphs = [_graph(f, data, ["bundle", i], {"calibration": merged.get("calibration"), **g}, g["name"], precision)
                  for i, g in enumerate(merged["bundle"])]
        names = [g.name for g in graphs]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise RecipeError(f"{at('bundle')}: graph name '{dup}' appears twice in the bundle",
                              "graph names must be unique within a bundle")
    else:
        graphs = [_graph(f, data, [], merged, name, precision)]

    copts = merged.get("compile", {})
    compile_opts = CompileOptions(
        embed=copts.get("embed", False),
        optimization_mode=copts.get("optimization_mode"),
        vtcm_mb=copts.get("vtcm_mb"),
        cpu_fallback=copts.get("cpu_fallback", False),
        provider_options=tuple(sorted((str(k), _opt_str(v)) for k, v in copts.get("provider_options", {}).items())),
        split_outputs=_split_outputs(copts.get("split_outputs", False)),
        quantized_io=copts.get("quantized_io", False),
    )
    group_toolchains: dict[str, tuple[Any, str]] = {}
    recipe_targets = _targets(f, data, merged["targets"], groups, group_toolchains)
    for t in recipe_targets:
        _check_vtcm(at("compile", "vtcm_mb"), "compile.vtcm_mb", compile_opts.vtcm_mb, t)
    _check_provider_options(f, data, compile_opts, recipe_targets)
    _check_layout(f, data, "bundle" in merged, merged.get("multi_soc", False), compile_opts, recipe_targets)
    if compile_opts.quantized_io:
        _check_quantized_io(f, data, "bundle" in merged, precision, compile_opts)
    if compile_opts.embed:
        _check_embed_size(f, data, graphs[0].model, precision)
    verify = merged.get("verify", {})
    verify = {"enabled": verify} if isinstance(verify, bool) else dict(verify)
    if verify.get("dir") and not (vdir := named_path(f.parent, verify["dir"])).is_dir():
        raise RecipeError(f"{at('verify', 'dir')}: verify dir '{verify['dir']}' "
                          f"{'is a file, not a directory' if vdir.exists() else 'not found'} (looked in {vdir})",
                          "give a directory of .npz/.npy samples, relative to the recipe")
    if precision == "auto":
        _check_auto(at, "bundle" in merged, merged.get("multi_soc", False), verify)
    quantization = quant.from_recipe(precision, merged.get("quantization"), recipe_targets, at)
    adapters = parse_adapters(f, data, merged["adapters"], precision) if "adapters" in merged else None
    if adapters and merged.get("multi_soc"):
        raise RecipeError(f"{at('adapters')}: adapters cannot be combined with multi_soc yet",
                          "build the adapters' base per SoC")
    if adapters and precision == "auto":
        raise RecipeError(f"{at('adapters')}: adapters cannot be combined with precision: auto yet (the search "
                          "verifies without adapters)", "choose a precision or a quantization block")
    return Recipe(name=name, file=f, precision=precision, graphs=graphs, targets=recipe_targets,
                  compile=compile_opts, is_bundle="bundle" in merged, multi_soc=merged.get("multi_soc", False),
                  verify=verify, quantization=quantization, adapters=adapters, runtimes=_runtimes(f, data, merged),
                  **toolchains.parse(f, data, merged, group_toolchains, {
                      "bundle": at("bundle") if "bundle" in merged else None,
                      "multi_soc": at("multi_soc") if merged.get("multi_soc") else None}),
                  rewrite=(merged.get("prepare") or {}).get("rewrite", True))


def _runtimes(f: Path, data: LineDict, merged: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """`runtimes:` checked for what no toolchain serves (the schema checked the shape). The file's own entries
    (a recipe's, or with `prefix` a defaults file's); inherited ones were checked in their defaults file."""
    from ctxbuild.toolchain.runtimes import runtime

    node: Any = data
    for key in prefix:
        node = node.get(key, {})
    for i, spec in enumerate(node.get("runtimes", [])):
        try:
            runtime(dict(spec), f"{f}:{line_of(data, [*prefix, 'runtimes', i])}: runtimes[{i}]")
        except UsageError as e:
            raise RecipeError(e.message, e.hint) from None
    return [dict(s) for s in merged.get("runtimes", [])]


def _check_auto(at: Any, bundle: bool, multi_soc: bool, verify: dict[str, Any]) -> None:
    """precision: auto decides by simulator runs of single-graph, single-SoC binaries."""
    for key, on in (("bundle", bundle), ("multi_soc", multi_soc)):
        if on:
            raise RecipeError(f"{at(key)}: precision: auto cannot be combined with {key} (the simulator cannot run "
                              "its binary)", "choose a precision (or a quantization block) for it")
    if verify.get("enabled") is False:
        raise RecipeError(f"{at('verify')}: precision: auto chooses by verification on the simulator; it cannot "
                          "be turned off", "remove `verify: false`, or choose a precision")


def _check_provider_options(f: Path, data: LineDict, copts: CompileOptions, targets: list[Target]) -> None:
    """soc_model/htp_arch select the SoC: a provider option saying otherwise than the target would ship a
    binary for another SoC under this target's name."""
    for key, value in copts.provider_options:
        if key not in ("soc_model", "htp_arch"):
            continue
        soc = soc_table.lookup(value) if key == "soc_model" else None  # QNN takes "SM8750" as well as "69"
        given = str(soc.soc_model) if soc is not None else value
        for t in targets:
            if given not in getattr(t, key).split(","):
                raise RecipeError(f"{f}:{line_of(data, ['compile', 'provider_options', key])}: compile.provider_options."
                                  f"{key} '{value}' contradicts target {t.name} ({key} {getattr(t, key)})",
                                  "choose the SoC with `targets`, and remove it from provider_options")


# The oldest onnxruntime-qnn these were measured on; older EPs lack ep.share_ep_contexts or multi-SoC contexts.
def _check_quantized_io(f: Path, data: LineDict, bundle: bool, precision: str, copts: CompileOptions) -> None:
    where = f"{f}:{line_of(data, ['compile', 'quantized_io'])}"
    if precision == "fp16":
        raise RecipeError(f"{where}: compile.quantized_io needs a quantized model; precision fp16 has float I/O",
                          "use precision int16, int8, qdq or auto, or remove compile.quantized_io")
    if bundle:
        raise RecipeError(f"{where}: compile.quantized_io is not supported for bundles",
                          "build the graphs with float I/O")
    if copts.split_outputs:
        raise RecipeError(f"{where}: compile.quantized_io cannot be combined with compile.split_outputs",
                          "remove one of them")


def _check_layout(f: Path, data: LineDict, bundle: bool, multi_soc: bool, copts: CompileOptions,
                  targets: list[Target]) -> None:
    """Combinations the QNN EP refuses, caught before anything is built."""
    def at(key: str) -> str:
        return f"{f}:{line_of(data, [key])}"

    if bundle and copts.split_outputs:
        raise RecipeError(f"{f}:{line_of(data, ['compile', 'split_outputs'])}: compile.split_outputs is not "
                          "supported for bundles", "split the outputs in the graphs' models instead")
    if bundle and copts.embed:
        raise RecipeError(f"{at('bundle')}: a bundle cannot use compile.embed: its graphs share one .bin",
                          "remove `embed: true`")
    if multi_soc and bundle:
        raise RecipeError(f"{at('multi_soc')}: multi_soc cannot be combined with a bundle (the QNN EP cannot "
                          "share weights across a multi-SoC context)", "build the bundle per SoC instead")
    if multi_soc and copts.embed:
        raise RecipeError(f"{at('multi_soc')}: multi_soc cannot be combined with compile.embed",
                          "remove `embed: true`")
    if multi_soc and len(targets) < 2:
        raise RecipeError(f"{at('multi_soc')}: multi_soc needs two or more targets", "list them in `targets`")


def _prebuilt_recipe(f: Path, data: LineDict, name: str, merged: dict[str, Any], groups: dict[str, list]) -> Recipe:
    spec = merged["prebuilt"]
    where = f"{f}:{line_of(data, ['prebuilt', 'bin'])}"
    binary = named_path(f.parent, spec["bin"])
    _check_file(where, f"prebuilt binary '{spec['bin']}'", binary, "a context binary; paths are relative to the "
                                                                   "recipe file")
    graphs = tuple(spec.get("graphs", [name]))
    if len(set(graphs)) != len(graphs):
        raise RecipeError(f"{where}: prebuilt.graphs names a graph twice", "graph names must be unique")
    copts = merged.get("compile", {})
    # Only the recipe's own keys: directory defaults written for compiled recipes apply to it harmlessly.
    unused = sorted(set(data.get("compile", {})) - {"embed"}) + [
        k for k in ("precision", "quantization", "calibration", "multi_soc", "inputs", "verify", "adapters", "prepare")
        if k in data]
    if unused:
        raise RecipeError(f"{f}:{line_of(data, ['prebuilt'])}: a prebuilt binary is not compiled; "
                          f"{', '.join(unused)} has no effect", "remove it (only compile.embed applies)")
    group_toolchains: dict[str, tuple[Any, str]] = {}
    targets = _targets(f, data, merged["targets"], groups, group_toolchains)
    return Recipe(name=name, file=f, precision="prebuilt", graphs=[], targets=targets,
                  runtimes=_runtimes(f, data, merged), **toolchains.parse(f, data, merged, group_toolchains, {}),
                  compile=CompileOptions(embed=copts.get("embed", False)), verify={"enabled": False},
                  prebuilt=Prebuilt(binary, graphs, spec.get("quantized_io", False),
                                    parse_sections(f, data, spec) if "adapters" in spec else None))


def _llm_recipe(f: Path, data: LineDict, name: str, merged: dict[str, Any], groups: dict[str, list]) -> Recipe:
    other = [k for k in ("precision", "quantization", "calibration", "multi_soc", "inputs", "adapters") if k in data]
    if other:
        raise RecipeError(f"{f}:{line_of(data, [other[0]])}: `{other[0]}` does not apply to an `llm:` recipe",
                          "move it inside the llm: block (llm.adapters)" if other[0] == "adapters" else
                          "set precision and prompts inside the llm: block (docs/llm.md)")
    group_toolchains: dict[str, tuple[Any, str]] = {}
    targets = _targets(f, data, merged["targets"], groups, group_toolchains)
    # every part is a weight-shared bundle: the toolchains must build bundles (MIN_QNN_EP)
    chosen = toolchains.parse(f, data, merged, group_toolchains, {"bundle": f"{f}:{line_of(data, ['llm'])}: llm"})
    spec = parse_llm(f, data, merged["llm"], targets)
    copts = merged.get("compile", {})
    compile_opts = CompileOptions(optimization_mode=copts.get("optimization_mode"), vtcm_mb=copts.get("vtcm_mb"),
                                  provider_options=tuple(sorted((str(k), _opt_str(v))
                                                                for k, v in copts.get("provider_options", {}).items())))
    verify = merged.get("verify", {})
    verify = {"enabled": verify} if isinstance(verify, bool) else dict(verify)
    return Recipe(name=name, file=f, precision=spec.precision, graphs=[], targets=targets, compile=compile_opts,
                  verify=verify, llm=spec, adapters=spec.adapters, runtimes=_runtimes(f, data, merged), **chosen)


def _split_outputs(v: bool | list[str]) -> bool | tuple[str, ...]:
    return tuple(v) if isinstance(v, list) else bool(v)


# Bytes of context binary per byte of model (.onnx + external data), measured with onnxruntime-qnn 2.7.0:
# fp16 halves float32 weights, int8/int16 quantize them to uint8, qdq models keep their 8-bit weights.
BINARY_PER_MODEL_BYTE = {"fp16": 0.5, "int8": 0.25, "int16": 0.25, "qdq": 1.0}
PROTOBUF_LIMIT = 2**31 - 1


def _check_embed_size(f: Path, data: LineDict, model: Path, precision: str) -> None:
    """An embedded binary is a protobuf attribute: over 2 GB the compile would fail after minutes of work."""
    from ctxbuild.graph.modelio import weight_bytes

    size = weight_bytes(model)
    binary = int(size * BINARY_PER_MODEL_BYTE.get(precision, 1.0))
    if binary > PROTOBUF_LIMIT:
        raise RecipeError(f"{f}:{line_of(data, ['compile', 'embed'])}: compile.embed: the context binary of "
                          f"{model.name} ({size / 2**30:.1f} GiB with its external data) would be about "
                          f"{binary / 2**30:.1f} GiB, over the 2 GB an ONNX file can embed",
                          "set compile.embed: false (the binary is written beside the _ctx.onnx)")


def _opt_str(v: Any) -> str:
    return ("1" if v else "0") if isinstance(v, bool) else str(v)


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _check_file(where: str, what: str, path: Path, wanted: str) -> None:
    """`path` must be a non-empty regular file; else say what it is (a FIFO or /dev/zero is not "not found",
    and an empty file would fail later with a confusing message). `wanted`: the hint, what to give."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise RecipeError(f"{where}: {what} not found (looked in {path})", f"give {wanted}") from None
    except OSError as e:
        raise RecipeError(f"{where}: {what} cannot be read: {e.strerror} ({path})", f"give {wanted}") from None
    kind = next((name for test, name in _NOT_REGULAR if test(st.st_mode)), None)
    if kind is not None:
        raise RecipeError(f"{where}: {what} is {kind}, not a regular file ({path})", f"give {wanted}")
    if st.st_size == 0:
        raise RecipeError(f"{where}: {what} is empty (0 bytes) ({path})", f"give {wanted}")


def _graph(f: Path, data: LineDict, path: list[str | int], spec: dict[str, Any], name: str, precision: str) -> Graph:
    where = f"{f}:{line_of(data, path + ['model'])}"
    model = named_path(f.parent, spec["model"])
    _check_file(where, f"model '{spec['model']}'", model, "an ONNX file; model paths are relative to the recipe file")
    if precision != "qdq" and (quantized := quantize_nodes(model)):
        raise RecipeError(f"{where}: {model.name} is already quantized (static QDQ: {len(quantized)} QuantizeLinear, "
                          f"e.g. '{quantized[0]}'); precision {precision} would quantize it again",
                          "use precision: qdq to build it as quantized, or give the float export for this precision")
    cal = spec.get("calibration")
    calibration = None
    if precision in ("int16", "int8", "auto"):
        if not cal or (not cal.get("dir") and not cal.get("random")):
            raise RecipeError(f"{where}: precision {precision} needs calibration data",
                              "set calibration.dir to a directory of .npz/.npy samples "
                              "(or calibration.random: true, which makes accuracy meaningless)")
        cdir = None
        if cal.get("dir"):
            cdir = named_path(f.parent, cal["dir"])
            if not cdir.is_dir():
                what = "is a file, not a directory" if cdir.exists() else "not found"
                raise RecipeError(f"{f}:{line_of(data, path + ['calibration', 'dir'])}: calibration dir "
                                  f"'{cal['dir']}' {what} (looked in {cdir})",
                                  "give a directory of .npz/.npy samples, relative to the recipe")
        calibration = Calibration(cdir, bool(cal.get("random")) and cdir is None, cal.get("samples", 8))
    inputs = {k: tuple(v) for k, v in spec.get("inputs", {}).items()}
    from ctxbuild.recipes import inputs as input_check

    input_check.check(model, inputs, {k: f"{f}:{line_of(data, path + ['inputs', k])}" for k in inputs}, where)
    return Graph(name=name, model=model, inputs=inputs, calibration=calibration)


def _check_vtcm(where: str, field: str, vtcm_mb: int | None, target: Target) -> None:
    """No more VTCM than the target's SoC has (known for the SoCs of the table; another soc_model is taken
    on trust). QNN accepted more and failed, or worse, on the device."""
    soc = soc_table.by_soc_model(target.soc_model)
    if vtcm_mb is not None and soc is not None and vtcm_mb > soc.vtcm_mb:
        raise RecipeError(f"{where}: {field} {vtcm_mb} is more than the {soc.vtcm_mb} MB of VTCM of {soc.name} "
                          f"(soc_model {soc.soc_model}, target '{target.name}')",
                          f"use at most {soc.vtcm_mb}, or leave it out (the SoC's default)")


def _targets(f: Path, data: LineDict, specs: list[Any], groups: dict[str, list],
             chosen: dict[str, tuple[Any, str]] | None = None) -> list[Target]:
    """The recipe's targets, groups expanded. `chosen` receives, per target name, the toolchain its target group
    names ((spec, where); the innermost group's wins)."""
    out: dict[str, Target] = {}

    def add(spec: Any, where: str, stack: tuple[str, ...], tc: tuple[Any, str] | None = None) -> None:
        if isinstance(spec, dict):
            builtin = soc_table.lookup(spec["name"])
            # The same SoC with other options (e.g. vtcm_mb) may keep its name; another SoC may not.
            if builtin is not None and (str(spec["soc_model"]), str(spec["htp_arch"])) != (
                    str(builtin.soc_model), str(builtin.htp_arch)):
                raise RecipeError(f"{where}: custom target name '{spec['name']}' is taken by the built-in SoC "
                                  f"{builtin.name} (soc_model {builtin.soc_model}, htp_arch {builtin.htp_arch}); "
                                  f"its outputs would mix with {builtin.name}'s under OUT",
                                  f"give it another name, or use '{builtin.name}' as is")
            if spec["name"].lower() in OUT_FILES:
                raise RecipeError(f"{where}: custom target name '{spec['name']}' is one of OUT's own files "
                                  f"({', '.join(OUT_FILES)}): its outputs would replace it or fail",
                                  "give the target another name")
            t = Target(spec["name"], str(spec["soc_model"]), str(spec["htp_arch"]), spec.get("vtcm_mb"))
            _check_vtcm(where, "vtcm_mb", t.vtcm_mb, t)
        elif spec in groups:
            if spec in stack:
                raise RecipeError(f"{where}: target group '{spec}' includes itself")
            for member, gf, gline, group_tc in groups[spec]:
                add(member, f"{gf}:{gline}", stack + (spec,), group_tc or tc)
            return
        else:
            soc = soc_table.lookup(spec)
            if soc is None:
                raise RecipeError(f"{where}: unknown SoC or target group '{spec}'",
                                  soc_table.suggest(spec, list(groups)))
            t = soc_table.soc_target(soc)
        if t.name in out and out[t.name] != t:
            raise RecipeError(f"{where}: target name '{t.name}' is defined twice with different settings")
        out[t.name] = t
        if tc is not None and chosen is not None:
            chosen[t.name] = tc

    for i, spec in enumerate(specs):
        add(spec, f"{f}:{line_of(data, ['targets', i])}", ())
    return list(out.values())
