"""One recipe, read and checked against the schema (recipe.py), turned into a Recipe: its source (model, bundle,
prebuilt binary or llm), graphs with their calibration and inputs, targets with groups expanded, compile options,
verification, quantization, adapters, runtimes and toolchains."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.errors import RecipeError, UsageError
from ctxbuild.graph.signature import quantize_nodes
from ctxbuild.layout import OUT_FILES, PACKAGES
from ctxbuild.recipes import precisions
from ctxbuild.recipes import quantization as quant
from ctxbuild.recipes import targets as soc_table
from ctxbuild.recipes import toolchains
from ctxbuild.recipes.adapters import Adapters, parse_adapters, parse_sections
from ctxbuild.recipes.alpha import is_alpha, parse_alpha
from ctxbuild.recipes.checks import (
    check_auto, check_embed_size, check_file, check_input_values, check_layout, check_outputs, check_provider_options,
    check_quantized_io, check_vtcm,
)
from ctxbuild.recipes.llm import parse_llm
from ctxbuild.recipes.objects import Calibration, CompileOptions, Graph, Prebuilt, Recipe
from ctxbuild.recipes.paths import named_path
from ctxbuild.recipes.targets import Target
from ctxbuild.recipes.yamlsrc import LineDict, line_of
from ctxbuild.toolchain.installed import version
from ctxbuild.toolchain.runtimes import fmt, parse_version

MODEL_PACKAGE_ORT = (1, 32)  # model packages written and opened through its Python API (older releases: not tried)


def parse_recipe(f: Path, data: LineDict, merged: dict[str, Any], groups: dict[str, list]) -> Recipe:
    """The Recipe of file `f`: `data` is its own YAML (for line numbers and its own keys), `merged` the same over
    its directory defaults; `groups` the target groups of those defaults."""

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
    if merged.get("precision") is None:
        raise RecipeError(f"{at()}: `precision` is required", f"one of {', '.join(precisions.names())}")
    precision = precisions.canonical(merged["precision"])  # an alias (int16, a16w8 ...) is its table name from here
    if "bundle" in merged:
        # the graphs' own fields: beside `bundle:` they apply to none (a directory default's applies to each graph)
        if own := next((k for k in ("inputs", "outputs", "input_values") if k in data), None):
            first = merged["bundle"][0]
            raise RecipeError(f"{at(own)}: {own}: a bundle's graphs set their own {own} (it applies to none here)",
                              f"move it into each graph's entry, e.g. `- {{name: {first['name']}, model: {first['model']}, "
                              f"{own}: {_flow(data[own])}}}`")
        # A graph's own fields win; the recipe's calibration and the directory defaults' graph fields are theirs
        graphs = [_graph(f, data, ["bundle", i], _with_defaults(merged, g), g["name"], precision)
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
        check_vtcm(at("compile", "vtcm_mb"), "compile.vtcm_mb", compile_opts.vtcm_mb, t)
    check_provider_options(f, data, compile_opts, recipe_targets)
    check_layout(f, data, "bundle" in merged, merged.get("multi_soc", False), compile_opts, recipe_targets)
    if compile_opts.quantized_io:
        check_quantized_io(f, data, "bundle" in merged, precision, compile_opts)
    if compile_opts.embed:
        check_embed_size(f, data, graphs[0].model, precision)
    verify = merged.get("verify", {})
    verify = {"enabled": verify} if isinstance(verify, bool) else dict(verify)
    if verify.get("dir") and not (vdir := named_path(f.parent, verify["dir"])).is_dir():
        raise RecipeError(f"{at('verify', 'dir')}: verify dir '{verify['dir']}' "
                          f"{'is a file, not a directory' if vdir.exists() else 'not found'} (looked in {vdir})",
                          "give a directory of .npz/.npy samples, relative to the recipe")
    if precision == "auto":
        check_auto(at, "bundle" in merged, merged.get("multi_soc", False), verify)
    quantization = quant.from_recipe(precision, merged.get("quantization"), recipe_targets, at, merged.get("auto"))
    spec = merged.get("adapters")
    alpha = (parse_alpha(f, data, spec, precision, bundle="bundle" in merged, multi_soc=merged.get("multi_soc", False))
             if spec and is_alpha(spec) else None)
    adapters = parse_adapters(f, data, spec, precision) if spec and not alpha else None
    if adapters:
        _check_fixed_slots(f, data, "bundle" in merged, graphs, adapters)
    if adapters and merged.get("multi_soc"):
        raise RecipeError(f"{at('adapters')}: adapters cannot be combined with multi_soc yet",
                          "build the adapters' base per SoC")
    if adapters and precision == "auto":
        raise RecipeError(f"{at('adapters')}: adapters cannot be combined with precision: auto yet (the search "
                          "verifies without adapters)", "choose a precision or a quantization block")
    return Recipe(name=name, file=f, precision=precision, graphs=graphs, targets=recipe_targets,
                  compile=compile_opts, is_bundle="bundle" in merged, multi_soc=merged.get("multi_soc", False),
                  verify=verify, quantization=quantization, adapters=adapters, alpha=alpha,
                  runtimes=parse_runtimes(f, data, merged),
                  package=_package(f, data, merged, name, "adapters" if spec else None),
                  **toolchains.parse(f, data, merged, group_toolchains, {
                      "multi_soc": at("multi_soc") if merged.get("multi_soc") else None}),
                  rewrite=(merged.get("prepare") or {}).get("rewrite", True),
                  search_siblings=(merged.get("auto") or {}).get("siblings", True))


def parse_runtimes(f: Path, data: LineDict, merged: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[dict[str, str]]:
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


def _prebuilt_recipe(f: Path, data: LineDict, name: str, merged: dict[str, Any], groups: dict[str, list]) -> Recipe:
    spec = merged["prebuilt"]
    where = f"{f}:{line_of(data, ['prebuilt', 'bin'])}"
    binary = named_path(f.parent, spec["bin"])
    check_file(where, f"prebuilt binary '{spec['bin']}'", binary, "a context binary; paths are relative to the "
                                                                   "recipe file")
    graphs = tuple(spec.get("graphs", [name]))
    if len(set(graphs)) != len(graphs):
        raise RecipeError(f"{where}: prebuilt.graphs names a graph twice", "graph names must be unique")
    copts = merged.get("compile", {})
    # Only the recipe's own keys: directory defaults written for compiled recipes apply to it harmlessly.
    unused = sorted(set(data.get("compile", {})) - {"embed"}) + [
        k for k in ("precision", "quantization", "calibration", "multi_soc", "inputs", "outputs", "input_values",
                    "verify", "adapters", "prepare")
        if k in data]
    if unused:
        raise RecipeError(f"{f}:{line_of(data, ['prebuilt'])}: a prebuilt binary is not compiled; "
                          f"{', '.join(unused)} has no effect", "remove it (only compile.embed applies)")
    group_toolchains: dict[str, tuple[Any, str]] = {}
    targets = _targets(f, data, merged["targets"], groups, group_toolchains)
    return Recipe(name=name, file=f, precision="prebuilt", graphs=[], targets=targets,
                  runtimes=parse_runtimes(f, data, merged), **toolchains.parse(f, data, merged, group_toolchains, {}),
                  package=_package(f, data, merged, name, "prebuilt.adapters" if "adapters" in spec else None),
                  compile=CompileOptions(embed=copts.get("embed", False)), verify={"enabled": False},
                  prebuilt=Prebuilt(binary, graphs, spec.get("quantized_io", False),
                                    parse_sections(f, data, spec) if "adapters" in spec else None))


def _llm_recipe(f: Path, data: LineDict, name: str, merged: dict[str, Any], groups: dict[str, list]) -> Recipe:
    other = [k for k in ("precision", "quantization", "calibration", "multi_soc", "inputs", "outputs", "input_values",
                         "adapters", "package")
             if k in data]
    if other:
        raise RecipeError(f"{f}:{line_of(data, [other[0]])}: `{other[0]}` does not apply to an `llm:` recipe",
                          "move it inside the llm: block (llm.adapters)" if other[0] == "adapters" else
                          "onnxruntime-genai runs it from the genai_config.json beside its parts (docs/llm.md)"
                          if other[0] == "package" else "set precision and prompts inside the llm: block (docs/llm.md)")
    group_toolchains: dict[str, tuple[Any, str]] = {}
    targets = _targets(f, data, merged["targets"], groups, group_toolchains)
    chosen = toolchains.parse(f, data, merged, group_toolchains, {})  # its bundles build on every release
    spec = parse_llm(f, data, merged["llm"], targets)
    copts = merged.get("compile", {})
    compile_opts = CompileOptions(optimization_mode=copts.get("optimization_mode"), vtcm_mb=copts.get("vtcm_mb"),
                                  provider_options=tuple(sorted((str(k), _opt_str(v))
                                                                for k, v in copts.get("provider_options", {}).items())))
    verify = merged.get("verify", {})
    verify = {"enabled": verify} if isinstance(verify, bool) else dict(verify)
    return Recipe(name=name, file=f, precision=spec.precision, graphs=[], targets=targets, compile=compile_opts,
                  verify=verify, llm=spec, adapters=spec.adapters, runtimes=parse_runtimes(f, data, merged), **chosen)


def _package(f: Path, data: LineDict, merged: dict[str, Any], name: str, adapters: str | None) -> str | None:
    """`package: true`: the model package's name (the recipe's, shared by its toolchain variants), else None.
    `adapters`: the recipe's adapters field, if it has one (a package would not carry them)."""
    if not merged.get("package"):
        return None
    at = f"{f}:{line_of(data, ['package'] if 'package' in data else [])}"
    if adapters:
        raise RecipeError(f"{at}: package: a model package does not carry LoRA adapters (`{adapters}`) yet",
                          "set package: false in this recipe, or build the adapters without a package")
    have = version("onnxruntime")
    if (parse_version(have) or (0,)) < MODEL_PACKAGE_ORT:
        raise RecipeError(f"{at}: package: onnxruntime {have} has no model package API "
                          f"({fmt(MODEL_PACKAGE_ORT)} or newer writes them)",
                          f"install onnxruntime>={fmt(MODEL_PACKAGE_ORT)}, or remove `package`")
    return name


def _with_defaults(merged: dict[str, Any], graph: dict[str, Any]) -> dict[str, Any]:
    """A bundle graph's entry over what the recipe gives every graph: its calibration, and the graph fields
    (inputs, input_values, outputs) only a directory default can hold here (beside `bundle:` they are refused).
    Mappings merge key by key, as defaults do; a graph's own `outputs` list replaces the default's."""
    spec = {"calibration": merged.get("calibration"), **graph}
    for field in ("inputs", "input_values", "outputs"):
        if field in merged:
            default = merged[field]
            own = graph.get(field)
            spec[field] = {**default, **(own or {})} if isinstance(default, dict) else default if own is None else own
    return spec


def _split_outputs(v: bool | list[str]) -> bool | tuple[str, ...]:
    return tuple(v) if isinstance(v, list) else bool(v)


def _check_fixed_slots(f: Path, data: LineDict, bundle: bool, graphs: list[Graph], adapters: Adapters) -> None:
    """An input `input_values:` fixes that the adapters set (adapters.scaling, or one a slot pattern matches): the
    adapters would make it an input again and the value would be dropped; the recipe must say which one sets it."""
    import fnmatch

    for i, g in enumerate(graphs):
        for name in g.input_values:
            at = f"{f}:{line_of(data, (['bundle', i] if bundle else []) + ['input_values', name])}"
            if adapters.scaling and fnmatch.fnmatchcase(name, adapters.scaling):
                raise RecipeError(f"{at}: input_values: '{name}' is adapters.scaling: each adapter sets it (its "
                                  "`scale`)", f"remove '{name}' from input_values, or give each adapter that scale")
            if slot := next((p for p in adapters.slots if fnmatch.fnmatchcase(name, p)), None):
                raise RecipeError(f"{at}: input_values: '{name}' is an adapter slot (adapters.slots '{slot}'): each "
                                  "adapter sets it", f"remove '{name}' from input_values, or narrow adapters.slots")


def _flow(v: Any) -> str:
    """A recipe value as YAML flow style, as a hint's line to paste (`{mode: 1}`, `[y]`)."""
    import json

    import yaml

    return yaml.safe_dump(json.loads(json.dumps(v)), default_flow_style=True, width=1 << 16).strip()


def _opt_str(v: Any) -> str:
    return ("1" if v else "0") if isinstance(v, bool) else str(v)


def _graph(f: Path, data: LineDict, path: list[str | int], spec: dict[str, Any], name: str, precision: str) -> Graph:
    where = f"{f}:{line_of(data, path + ['model'])}"
    model = named_path(f.parent, spec["model"])
    check_file(where, f"model '{spec['model']}'", model, "an ONNX file; model paths are relative to the recipe file")
    if precision != "qdq" and (quantized := quantize_nodes(model)):
        raise RecipeError(f"{where}: {model.name} is already quantized (static QDQ: {len(quantized)} QuantizeLinear, "
                          f"e.g. '{quantized[0]}'); precision {precision} would quantize it again",
                          "use precision: qdq to build it as quantized, or give the float export for this precision")
    cal = spec.get("calibration")
    calibration = None
    if (precisions.quantized(precision) or precision == "auto") and (not cal or (not cal.get("dir") and not cal.get("random"))):
        raise RecipeError(f"{where}: precision {precision} needs calibration data",
                          "set calibration.dir to a directory of .npz/.npy samples "
                          "(or calibration.random: true, which makes accuracy meaningless)")
    # At fp16 and qdq nothing is calibrated, but the samples are the user's inputs: verification runs on them
    # when the recipe gives no verify.dir (it ran on random data, and passed what the user's samples fail).
    if cal and (precisions.quantized(precision) or precision == "auto" or cal.get("dir")):
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

    own: Any = data  # the graph's own fields in the recipe's file (a bundle a directory default gave: none)
    for p in path:
        own = own[p] if isinstance(own, dict) and p in own or isinstance(own, list) and p < len(own) else {}

    def at(field: str, *key: str) -> str:
        """file:line of one of the graph's fields; one a directory's _defaults.yaml gave says so (the recipe's
        file has no line for it)."""
        given = field in own and (not key or key[0] in own[field])  # a bundle graph's key may be the default's
        return f"{f}:{line_of(data, path + [field, *key])}" + (
            "" if given else f" ({field} from the directory defaults, _defaults.yaml)")

    values = dict(spec.get("input_values", {}))
    if values:  # before the shapes: a fixed input needs none
        check_input_values(model, values, inputs, {k: at("input_values", k) for k in values})
    input_check.check(model, inputs, {k: at("inputs", k) for k in inputs}, where, fixed=set(values),
                      samples=calibration.dir if calibration else None)
    if outputs := tuple(spec.get("outputs", ())):
        check_outputs(model, outputs, at("outputs"), values)
    return Graph(name=name, model=model, inputs=inputs, calibration=calibration, outputs=outputs,
                 input_values=values)


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
            if spec["name"].lower() in (*OUT_FILES, PACKAGES):
                raise RecipeError(f"{where}: custom target name '{spec['name']}' is one of OUT's own files or "
                                  f"directories ({', '.join(OUT_FILES)}, {PACKAGES}): its outputs would replace "
                                  "them or fail", "give the target another name")
            t = Target(spec["name"], str(spec["soc_model"]), str(spec["htp_arch"]), spec.get("vtcm_mb"))
            check_vtcm(where, "vtcm_mb", t.vtcm_mb, t)
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

    given = "" if "targets" in data else " (targets from the directory defaults, _defaults.yaml)"  # no line here
    for i, spec in enumerate(specs):
        add(spec, f"{f}:{line_of(data, ['targets', i])}{given}", ())
    return list(out.values())
