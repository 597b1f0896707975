"""What a recipe may not ask for although the schema allows it, refused before anything is built: combinations
the QNN EP refuses, a provider option contradicting the target, more VTCM than the SoC has, an embedded binary
over protobuf's 2 GB, files that are not regular files, precision: auto where the simulator cannot decide, `outputs:`
naming a tensor the model does not compute."""
from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, Callable

from ctxbuild.errors import ActionError, RecipeError
from ctxbuild.graph.signature import memoized_by_stat
from ctxbuild.recipes import precisions
from ctxbuild.recipes import targets as soc_table
from ctxbuild.recipes.objects import CompileOptions
from ctxbuild.recipes.targets import Target
from ctxbuild.recipes.yamlsrc import LineDict, line_of

TENSORS_MEMO = "memo/graph-tensors"  # graph/cut.tensors(): what `outputs:` may name
INPUT_TYPES_MEMO = "memo/graph-input-types"  # graph/inputvalues.declared(): what `input_values:` may set
BOOL = 9  # onnx.TensorProto.BOOL (onnx is not imported to check a recipe)


def check_auto(at: Any, bundle: bool, multi_soc: bool, verify: dict[str, Any]) -> None:
    """precision: auto decides by simulator runs of single-graph, single-SoC binaries."""
    for key, on in (("bundle", bundle), ("multi_soc", multi_soc)):
        if on:
            raise RecipeError(f"{at(key)}: precision: auto cannot be combined with {key} (the simulator cannot run "
                              "its binary)", "choose a precision (or a quantization block) for it")
    if verify.get("enabled") is False:
        raise RecipeError(f"{at('verify')}: precision: auto chooses by verification on the simulator; it cannot "
                          "be turned off", "remove `verify: false`, or choose a precision")


def check_provider_options(f: Path, data: LineDict, copts: CompileOptions, targets: list[Target]) -> None:
    """soc_model/htp_arch select the SoC: a provider option saying otherwise than the target would ship a
    binary for another SoC under this target's name."""
    for key, value in copts.provider_options:
        if key in ("backend_type", "backend_path"):  # onnxruntime refuses both together; any other backend
            # is not the NPU's (and its failure reads as "QNN cannot run every node")
            raise RecipeError(f"{f}:{line_of(data, ['compile', 'provider_options', key])}: compile.provider_options."
                              f"{key} is ctxbuild's to set: it builds context binaries for the HTP (the NPU) "
                              "backend", "remove it from provider_options")
        if key not in ("soc_model", "htp_arch"):
            continue
        soc = soc_table.lookup(value) if key == "soc_model" else None  # QNN takes "SM8750" as well as "69"
        given = str(soc.soc_model) if soc is not None else value
        for t in targets:
            if given not in getattr(t, key).split(","):
                raise RecipeError(f"{f}:{line_of(data, ['compile', 'provider_options', key])}: compile.provider_options."
                                  f"{key} '{value}' contradicts target {t.name} ({key} {getattr(t, key)})",
                                  "choose the SoC with `targets`, and remove it from provider_options")


def check_quantized_io(f: Path, data: LineDict, bundle: bool, precision: str, copts: CompileOptions) -> None:
    where = f"{f}:{line_of(data, ['compile', 'quantized_io'])}"
    if precision == "fp16":
        raise RecipeError(f"{where}: compile.quantized_io needs a quantized model; precision fp16 has float I/O",
                          "use precision w8a16, w8a8, w16a16, qdq or auto, or remove compile.quantized_io")
    if bundle:
        raise RecipeError(f"{where}: compile.quantized_io is not supported for bundles",
                          "build the graphs with float I/O")
    if copts.split_outputs:
        raise RecipeError(f"{where}: compile.quantized_io cannot be combined with compile.split_outputs",
                          "remove one of them")


def check_layout(f: Path, data: LineDict, bundle: bool, multi_soc: bool, copts: CompileOptions,
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


PROTOBUF_LIMIT = 2**31 - 1


def check_embed_size(f: Path, data: LineDict, model: Path, precision: str) -> None:
    """An embedded binary is a protobuf attribute: over 2 GB the compile would fail after minutes of work."""
    from ctxbuild.graph.modelio import weight_bytes

    size = weight_bytes(model)
    binary = int(size * (precisions.get(precision).binary_per_model_byte or 1.0))
    if binary > PROTOBUF_LIMIT:
        raise RecipeError(f"{f}:{line_of(data, ['compile', 'embed'])}: compile.embed: the context binary of "
                          f"{model.name} ({size / 2**30:.1f} GiB with its external data) would be about "
                          f"{binary / 2**30:.1f} GiB, over the 2 GB an ONNX file can embed",
                          "set compile.embed: false (the binary is written beside the _ctx.onnx)")


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_file(where: str, what: str, path: Path, wanted: str) -> None:
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


def check_vtcm(where: str, field: str, vtcm_mb: int | None, target: Target) -> None:
    """No more VTCM than the target's SoC has (known for the SoCs of the table; another soc_model is taken
    on trust). QNN accepted more and failed, or worse, on the device."""
    soc = soc_table.by_soc_model(target.soc_model)
    if vtcm_mb is not None and soc is not None and vtcm_mb > soc.vtcm_mb:
        raise RecipeError(f"{where}: {field} {vtcm_mb} is more than the {soc.vtcm_mb} MB of VTCM of {soc.name} "
                          f"(soc_model {soc.soc_model}, target '{target.name}')",
                          f"use at most {soc.vtcm_mb}, or leave it out (the SoC's default)")


def check_input_values(model: Path, values: dict[str, Any], shapes: dict[str, Any], where: dict[str, str]) -> None:
    """Each entry of the recipe's `input_values:` (at `where[name]`, `file:line`) must be an input of the model
    that `inputs:` does not also give a shape, its value of the input's type and shape; else one line."""
    from ctxbuild.graph.inputvalues import as_array, declared
    from ctxbuild.recipes.suggest import did_you_mean

    found = _read_memoized(model, INPUT_TYPES_MEMO, declared)
    if found is None:
        return
    if found and set(found) <= set(values):  # prepare would fold it all: the compile would blame QNN's op support
        raise RecipeError(f"{where[next(iter(values))]}: input_values fixes every input of {model.name} "
                          f"({', '.join(sorted(found))}): the model computes a constant, nothing is left to build",
                          "leave the inputs the app feeds out of input_values")
    for name, value in values.items():
        if name not in found:
            raise RecipeError(f"{where[name]}: input_values: '{name}' is not an input of {model.name}",
                              did_you_mean(name, list(found), otherwise=None) or
                              f"its inputs are: {', '.join(found)}")
        if name in shapes:
            raise RecipeError(f"{where[name]}: input_values: '{name}' is also in inputs: a fixed input is no longer "
                              "an input of the build", f"remove '{name}' from inputs")
        if _booleans(value) and found[name][0] != BOOL:  # numpy would take true as 1 without a word
            from onnx.helper import tensor_dtype_to_np_dtype

            raise RecipeError(f"{where[name]}: input_values: '{name}': the input is "
                              f"{tensor_dtype_to_np_dtype(found[name][0]).name}, {json.dumps(value)} is a boolean",
                              "give a number (YAML reads on/off/yes/no, unquoted, as true/false)")
        try:
            as_array(value, *found[name])
        except ValueError as e:
            raise RecipeError(f"{where[name]}: input_values: '{name}': {e}",
                              "give the value the app always passes, as a number, true/false or a list") from None


def _booleans(value: Any) -> bool:
    """A value holding true/false anywhere (YAML's on/off/yes/no too)."""
    return isinstance(value, bool) or isinstance(value, list) and any(map(_booleans, value))


def check_outputs(model: Path, names: tuple[str, ...], where: str, values: dict[str, Any]) -> None:
    """Each name of the recipe's `outputs:` (at `where`, `file:line`) must be a tensor the model's nodes compute,
    named as the model names it; else one line with the closest name. With `input_values:` (`values`), the
    model is read with them applied: the Ifs they decide inlined, the tensors of the branches taken count."""
    import hashlib

    from ctxbuild.graph.cut import tensors, values_line
    from ctxbuild.graph.inputvalues import apply
    from ctxbuild.recipes.suggest import did_you_mean

    def read(proto: Any) -> dict[str, list[str]]:
        if not values:
            return tensors(proto)
        branches = sorted(_in_branches(proto.graph))
        apply(proto, values)  # checked before: they fit
        return {**tensors(proto), "in_branches": branches}

    memo = TENSORS_MEMO + (f"/{hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]}"
                           if values else "")
    found = _read_memoized(model, memo, read)
    if found is None:
        return
    for name in names:
        if name in found["inputs"] or name in found["constants"]:
            what = "an input" if name in found["inputs"] else "a constant (initializer)"
            raise RecipeError(f"{where}: outputs: '{name}' is {what} of {model.name}, not a tensor it computes",
                              "name tensors the model's nodes compute")
        if name not in found["computed"] and name in found.get("in_branches", ()):
            raise RecipeError(f"{where}: outputs: '{name}' is computed in an If branch `{values_line(values)}` does not "
                              "take (nothing of that branch is built)",
                              "name a tensor of the branch the values take, or change input_values")
        if name not in found["computed"]:
            raise RecipeError(f"{where}: outputs: '{name}' is not a tensor of {model.name}",
                              did_you_mean(name, found["computed"], otherwise=None) or
                              "name tensors the model's nodes compute (as Netron shows them)")


def _in_branches(graph: Any) -> set[str]:
    """The tensors the nodes inside `graph`'s subgraphs (If branches, loop bodies) compute, nested ones too."""
    found: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                found |= {o for n in sub.node for o in n.output if o} | _in_branches(sub)
    return found


def _read_memoized(model: Path, memo: str, read: Callable[[Any], Any]) -> Any:
    """read(the model's proto, without external data), memoized by the file's stat; None when the file is not
    ONNX (the prepare action says so, with its own message)."""
    from ctxbuild.graph.modelio import load

    def compute() -> Any:
        try:
            return read(load(model, external_data=False))
        except ActionError:
            return None

    return memoized_by_stat(model, memo, compute)
