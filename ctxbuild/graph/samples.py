"""Input samples (.npz keyed by input name, or .npy for single-input models), checked against the model."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ctxbuild.errors import ActionError, SampleError, cause_line
from ctxbuild.graph.modelio import graph_inputs
from ctxbuild.graph.signature import LAYOUTS

RANDOM_SEED = 0
if TYPE_CHECKING:  # numpy is imported where arrays are made: listing samples (a cache lookup) needs none
    import numpy as np

InputSpec = dict[str, tuple[tuple[int, ...], "np.dtype"]]


def list_samples(d: Path, limit: int, recipe: str) -> dict[str, Path]:
    """The first `limit` samples of `d`. Every .npz/.npy entry is a regular file (its links followed) or a refusal
    naming it: dangling links, FIFOs and /dev/zero were skipped silently (1 of 4 samples verified, "ok")."""
    entries = sorted(p for p in d.iterdir() if p.suffix in (".npz", ".npy"))
    if odd := [p for p in entries if not p.is_file()]:
        import stat

        def what(p: Path) -> str:
            if not p.exists():
                return "a dangling symbolic link" if p.is_symlink() else "gone"
            mode = p.stat().st_mode
            return "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"

        raise ActionError(f"{recipe}: sample {odd[0]} is {what(odd[0])}"
                          + (f" ({len(odd) - 1} more entries of {d} are no files either)" if len(odd) > 1 else ""),
                          "every .npz/.npy entry of a sample directory must be a sample file: remove or replace it")
    files = entries
    if not files:
        other = sorted({p.suffix or p.name for p in d.iterdir() if p.is_file()})
        raise ActionError(f"{recipe}: sample dir {d} has no .npz/.npy files" + (
                          f" (it holds {', '.join(other[:5])} files)" if other else ""),
                          "add samples, one .npz per sample keyed by input name (or a .npy for a single-input "
                          "model): the arrays as the app feeds them to the model, e.g. an image decoded, resized "
                          "and normalized, not the image file")
    return {f"sample:{p.name}": p for p in files[:limit]}


Header = tuple[tuple[int, ...], "np.dtype"]  # an array's shape and dtype, as its .npy header says


def first_header(samples: Path, name: str, only_input: bool) -> tuple[Header | None, str] | None:
    """(shape, dtype) of input `name` in the first sample of directory `samples` (a .npy for a model's only input,
    an .npz's array of that name), read from the array's header alone (None if it cannot be), and the file's
    name; None when the directory holds no sample."""
    files = sorted(p for p in samples.iterdir() if p.suffix in (".npy", ".npz") and p.is_file()) \
        if samples.is_dir() else []
    if not files:
        return None
    return header(files[0], name, only_input), files[0].name


def header(file: Path, name: str, only_input: bool) -> Header | None:
    """(shape, dtype) of input `name` in sample `file`, from the array's header alone; None if it cannot be read
    (or a .npy sample of a model with several inputs)."""
    import zipfile
    from contextlib import nullcontext

    import numpy as np

    if file.suffix == ".npy" and not only_input:
        return None
    try:
        with (zipfile.ZipFile(file) if file.suffix == ".npz" else nullcontext()) as z, \
                (z.open(f"{name}.npy") if z else open(file, "rb")) as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            return tuple(shape), dtype
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None


def cast_warnings(what: str, files: list[Path], spec: InputSpec) -> list[str]:
    """One line per input whose samples are stored in another dtype than the model takes (read from the headers).
    A cast that changes a value fails the sample's check (check_sample), so a build that gets here kept them all;
    integers for a float input are used as stored, which the app may not do (it may normalize)."""
    found = []
    for name, (_, dtype) in spec.items():
        stored = next(((h[1], f.name) for f in files if (h := header(f, name, len(spec) == 1)) and h[1] != dtype), None)
        if stored is None:
            continue
        kind, file = stored
        if dtype.kind == "f" and kind.kind in "iub":
            found.append(f"{what}: sample {file} holds {name} as {kind}, the model takes {dtype}: used as stored (e.g. "
                         "0-255); if the app normalizes its inputs, save the samples normalized")
        else:
            how = "rounded" if dtype.kind == kind.kind == "f" and dtype.itemsize < kind.itemsize else "every value kept"
            found.append(f"{what}: sample {file} holds {name} as {kind}, the model takes {dtype}: cast to {dtype} "
                         f"({how}); save the samples as {dtype}")
    return found


def input_spec(model: Any) -> InputSpec:
    import numpy as np
    from onnx.helper import tensor_dtype_to_np_dtype

    return {i.name: (tuple(d.dim_value for d in i.type.tensor_type.shape.dim),
                     np.dtype(tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))) for i in graph_inputs(model)}


def random_samples(spec: InputSpec, n: int) -> Iterator[dict[str, np.ndarray]]:
    import numpy as np

    rng = np.random.default_rng(RANDOM_SEED)
    for _ in range(n):
        yield {name: rng.random(shape).astype(dtype) for name, (shape, dtype) in spec.items()}


def from_files(spec: InputSpec, files: dict[str, Path], recipe: str, fixed: dict[str, np.ndarray] | None = None
               ) -> Iterator[dict[str, np.ndarray]]:
    """The samples `files`, checked against `spec`. `fixed`: inputs the recipe's `input_values:` made constants
    (graph/inputvalues.recorded()): a sample may hold them, at that value only, and they are left out."""
    for path in files.values():
        yield check_sample(load_sample(path, spec), spec, path, recipe, fixed or {})


def load_sample(path: Path, spec: InputSpec) -> dict[str, np.ndarray]:
    if path.suffix != ".npz" and len(spec) != 1:
        raise ActionError(f"{path}: a .npy sample holds one array but the model has inputs "
                          f"{', '.join(spec)}", "use .npz files keyed by input name")
    arrays = read_arrays(path, "sample")
    return arrays if path.suffix == ".npz" else {next(iter(spec)): arrays[""]}


_MAGIC = {".npz": (b"PK\x03\x04", b"PK\x05\x06"), ".npy": (b"\x93NUMPY",)}  # a zip (or an empty one); .npy


def read_arrays(path: Path, what: str) -> dict[str, np.ndarray]:
    """The arrays of a .npz (by name) or a .npy (under ""), never unpickling anything. A file that is not
    one, is cut short, or holds Python objects is one ActionError naming it: np.load alone would treat a
    non-zip as a pickle and advise allow_pickle=True (running code from the file), or raise zipfile's and
    zlib's own errors."""
    import zipfile
    import zlib

    import numpy as np

    try:
        with open(path, "rb") as f:
            head = f.read(6)
        if not head.startswith(_MAGIC[path.suffix]):
            raise ValueError(f"not a {path.suffix} file ({'empty' if not head else f'it starts with {head!r}'})")
        if path.suffix == ".npy":
            return {"": np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        cause = cause_line(e, limit=200)
        if "pickle" in cause:  # numpy's message advises allow_pickle=True: never
            cause = "it holds Python objects (pickled), which ctxbuild never loads"
        raise ActionError(f"{path}: cannot read {what}: {cause}",
                          "save plain numeric arrays with numpy.savez / numpy.save") from None


def check_sample(sample: dict[str, np.ndarray], spec: InputSpec, path: Path, recipe: str,
                 fixed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import numpy as np

    for name in sorted(set(sample) & set(fixed)):  # recorded by the app: the value the build fixed, or a mistake
        got = np.asarray(sample[name])
        if got.size != fixed[name].size or not np.array_equal(got.reshape(fixed[name].shape), fixed[name]):
            raise ActionError(f"{path}: '{name}' is {got.tolist()} in this sample, the recipe's input_values fixes "
                              f"it to {fixed[name].tolist()}",
                              f"remove the sample, or build that value with another recipe (recipe {recipe})")
        sample = {k: v for k, v in sample.items() if k != name}
    unknown = sorted(set(sample) - set(spec))
    missing = sorted(set(spec) - set(sample))
    if unknown or missing:
        raise ActionError(f"{path}: sample keys {sorted(sample)} do not match the model inputs {sorted(spec)}"
                          + (f" (unknown: {', '.join(unknown)})" if unknown else "")
                          + (f" (missing: {', '.join(missing)})" if missing else ""),
                          "name the arrays after the inputs, numpy.savez(file, "
                          f"{', '.join(f'{n}=...' for n in sorted(spec))}) (recipe {recipe})")
    out = {}
    for name, arr in sample.items():
        shape, dtype = spec[name]
        if tuple(arr.shape) != shape:
            raise ActionError(f"{path}: '{name}' has shape {list(arr.shape)}, the recipe fixes it to {list(shape)}",
                              _layout_fix(tuple(arr.shape), shape)
                              or "regenerate the samples at the recipe's input shape")
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            bad = int(arr.size - np.isfinite(arr).sum())
            raise ActionError(f"{path}: '{name}' holds {bad} NaN/Inf value(s)",
                              "samples must be real, finite inputs; regenerate this file")
        out[name] = _cast(arr, dtype, path, name)
    return out


def _cast(arr: np.ndarray, dtype: np.dtype, path: Path, name: str) -> np.ndarray:
    """`arr` as the model's dtype; a cast that changes a value (0.5 for a bool input, an int64 beyond int32) is a
    SampleError: the model would be calibrated and verified on other inputs than the file holds. Floats narrowed to
    a smaller float are rounded, as an app's feed would be, unless they overflow it."""
    import numpy as np

    if arr.dtype == dtype:
        return arr
    with np.errstate(all="ignore"):
        cast = arr.astype(dtype)
        if dtype.kind == arr.dtype.kind == "f":
            changed = ~np.isfinite(cast)
        else:
            changed = cast.astype(arr.dtype) != arr
    if changed.any():
        i = int(np.flatnonzero(changed)[0])
        raise SampleError(f"{path}: '{name}' is {arr.dtype}, the model takes {dtype}, and the cast changes values "
                          f"({arr.flat[i].item()!r} becomes {cast.flat[i].item()!r}, {int(changed.sum())} of {arr.size})",
                          f"save the sample's '{name}' as {dtype}, with the values the app feeds")
    return cast


def _layout_fix(got: tuple[int, ...], want: tuple[int, ...]) -> str | None:
    """The sample holds the input in the other image layout (NHWC for NCHW, or back), or without the batch dim of
    one (an image as decoded, HWC): the expression that fixes it."""
    batch = ""
    if len(got) == 3 and len(want) == 4 and want[0] == 1:
        got, batch = (1, *got), "[None]"
    for perm, (layout, other) in LAYOUTS.items() if len(got) == len(want) == 4 else ():
        if tuple(got[p] for p in perm) == want:
            layouts = f"{layout[1:]} without the batch dim" if batch else layout
            return (f"the sample is {layouts}, the model takes {other}: save numpy.transpose(array, "
                    f"{tuple(p - 1 for p in perm[1:]) if batch else perm}){batch} instead")
    if batch and got == want:
        return "the sample lacks the batch dim of 1: save array[None] instead"
    return None


def for_verification(spec: InputSpec, params: dict[str, Any], find: Callable[[], Any],
                     recipe_file: str, fixed: dict[str, np.ndarray] | None = None) -> list[dict[str, np.ndarray]]:
    """The samples a verifying action (verify, verify_adapter, screen) compares on: `params["samples"]` random
    ones when its `sample_source` is random, else the files `find()` discovers (listed only then); `fixed` as
    from_files takes it."""
    if params["sample_source"] == "random":
        return list(random_samples(spec, params["samples"]))
    return list(from_files(spec, find(), recipe_file, fixed))
