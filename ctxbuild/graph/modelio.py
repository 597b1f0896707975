"""Reading ONNX models with errors that name the file, and describing their graph inputs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError, cause_line


def load(path: Path, *, external_data: bool = True) -> Any:
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise ActionError(f"{path}: model file not found")
    try:
        return onnx.load(str(path), load_external_data=external_data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise ActionError(f"{path}: not a valid ONNX model ({cause_line(e, limit=120)})",
                          "re-export the model; the file may be truncated or not ONNX") from None
    except FileNotFoundError as e:
        raise ActionError(f"{path}: external data file missing: {e.filename}",
                          "keep the model's .data files next to it") from None


def graph_inputs(model: Any) -> list[Any]:
    """Real inputs: graph inputs that are not initializers (older exporters list weights as inputs)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def external_data_files(model: Any, model_path: Path, follow_links: bool = False) -> dict[str, Path]:
    """role `external:<location>` -> the file; `follow_links`: a location that is a symlink beside the model
    (a Hugging Face cache's layout) is taken, as its target; its reader must not hand the model to onnx as is."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    files: dict[str, Path] = {}
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc:
                files[f"external:{loc}"] = _checked_location(model_path, t.name, loc, follow_links)
    return files


def _checked_location(model_path: Path, tensor: str, loc: str, follow_links: bool) -> Path:
    """Before anything reads it: inside the model's directory (no absolute path, no '..' out, no symlink
    out unless `follow_links`) and a regular file (not /dev/zero, a fifo or a directory)."""
    import os
    import stat

    if follow_links:  # the names as the model's directory lays them out, symlinks not resolved
        base = Path(os.path.abspath(model_path)).parent
        path = Path(os.path.normpath(base / loc))
    else:
        base = model_path.resolve().parent
        path = (base / loc).resolve()
    where = f"{model_path}: tensor '{tensor}': external data location '{loc}'"
    if Path(loc).is_absolute() or not path.is_relative_to(base):
        raise ActionError(f"{where} is outside the model's directory",
                          "keep external data files beside the model (onnx refuses other locations too)")
    try:
        mode = path.stat().st_mode
    except OSError:
        raise ActionError(f"{where}: file not found ({path})", "keep the model's .data files next to it") from None
    if not stat.S_ISREG(mode):
        raise ActionError(f"{where} is not a regular file", "point it at the model's .data file")
    return path
# Models whose weights sit in external data are small protobufs; parsing one at plan time costs
# milliseconds. A bigger file holds its weights inline: its own size is the answer.
_PARSE_LIMIT = 64 << 20


def weight_bytes(path: Path) -> int:
    """The model file plus every external data file it names (sizes from stat, nothing read whole)."""
    size = path.stat().st_size
    if size > _PARSE_LIMIT:
        return size
    try:
        model = load(path, external_data=False)
        files = external_data_files(model, path, follow_links=True)
    except ActionError:
        return size  # the action reports the broken model with its own error
    return size + sum(p.stat().st_size for p in set(files.values()) if p.is_file())


def data_path(model: Path) -> Path:
    """Where ctxbuild's own model outputs keep their weights: `<model>.data` beside the model."""
    return model.with_name(model.name + ".data")


def save_with_data(model: Any, dst: Path, min_bytes: int = 1024) -> None:
    """Save a model held in memory as `dst` + `data_path(dst)` (tensors of `min_bytes` or more go there; the
    data file exists even when none does, like every model ctxbuild writes)."""
    import onnx

    onnx.save(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
              location=data_path(dst).name, size_threshold=min_bytes)
    data_path(dst).touch()


def save_external(model: Any, src_dir: Path, dst: Path, inline_max: int | None = None) -> None:
    """Save `model` (loaded without external data, weights still in files under `src_dir`) as `dst` with
    every external tensor copied into `data_path(dst)`: streamed range by range, never whole in memory.
    With `inline_max`, inline tensors larger than that many bytes move there too (weights a rewrite made).
    The data file is written even when empty, so the action always has the outputs the plan declares."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    data = data_path(dst)
    with open(data, "wb") as out:
        for t in _get_all_tensors(model):
            start = out.tell()
            if not uses_external_data(t):
                if inline_max is None or not t.HasField("raw_data") or len(t.raw_data) <= inline_max:
                    continue
                out.write(t.raw_data)
                copied = len(t.raw_data)
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
            else:
                info = {e.key: e.value for e in t.external_data}
                offset, length = int(info.get("offset", 0)), info.get("length")
                with open(src_dir / info["location"], "rb") as f:
                    f.seek(offset)
                    copied = _copy_range(f, out, int(length) if length is not None else None)
            del t.external_data[:]
            for k, v in (("location", data.name), ("offset", str(start)), ("length", str(copied))):
                t.external_data.add(key=k, value=v)
    onnx.save(model, str(dst))


def _copy_range(src: Any, dst: Any, length: int | None) -> int:
    copied = 0
    while length is None or copied < length:
        chunk = src.read(1 << 20 if length is None else min(1 << 20, length - copied))
        if not chunk:
            break
        dst.write(chunk)
        copied += len(chunk)
    return copied


def initializer_digests(path: Path) -> dict[str, tuple[int, int, str]]:
    """name -> (data type, element count, sha256 of its little-endian bytes) for every initializer, with
    external data hashed in 1 MB reads: comparing the weights of multi-GB models costs no memory."""
    import hashlib
    import math

    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    out = {}
    for t in load(path, external_data=False).graph.initializer:
        h = hashlib.sha256()
        if uses_external_data(t):
            info = {e.key: e.value for e in t.external_data}
            with open(path.parent / info["location"], "rb") as f:
                f.seek(int(info.get("offset", 0)))
                _copy_range(f, _Hasher(h), int(info["length"]) if "length" in info else None)
        else:
            h.update(t.raw_data if t.HasField("raw_data") else numpy_helper.to_array(t).tobytes())
        out[t.name] = (t.data_type, math.prod(t.dims), h.hexdigest())
    return out


class _Hasher:
    """A write-only file over a hash object, for _copy_range."""

    def __init__(self, h: Any) -> None:
        self.h = h

    def write(self, data: bytes) -> None:
        self.h.update(data)
