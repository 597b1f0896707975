"""Reading ONNX models with errors that name the file, and describing their graph inputs."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError, cause_line
from ctxbuild.graph.external_data import all_tensors, checked_location, load_data


def load(path: Path, *, external_data: bool = True) -> Any:
    """The model; with `external_data`, its weights read by ctxbuild (graph/external_data.py: onnx's loader
    refuses the local cache's hard-linked weight files)."""
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise ActionError(f"{path}: model file not found")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise ActionError(f"{path}: not a valid ONNX model ({cause_line(e, limit=120)})",
                          "re-export the model; the file may be truncated or not ONNX") from None
    if external_data:
        load_data(model, path)
    return model


def graph_inputs(model: Any) -> list[Any]:
    """Real inputs: graph inputs that are not initializers (older exporters list weights as inputs)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def external_data_files(model: Any, model_path: Path, follow_links: bool = False) -> dict[str, Path]:
    """role `external:<location>` -> the file; `follow_links`: a location that is a symlink beside the model
    (a Hugging Face cache's layout) is taken, as its target; its reader must not hand the model to onnx as is."""
    from onnx.external_data_helper import uses_external_data

    files: dict[str, Path] = {}
    for t in all_tensors(model):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc:
                files[f"external:{loc}"] = checked_location(model_path, t.name, loc, follow_links)
    return files


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
    with SharedData(data_path(dst), dedupe=False) as data:
        data.save(model, src_dir, dst, inline_max)


class SharedData:
    """One external data file that several models in one directory point into (an LLM part's graphs at every
    AR x CL differ in shapes only): with `dedupe`, a tensor's bytes are written once and every model saved
    through it names that one range. Tensors are the same when they come from the same range of the same file,
    else when their bytes hash the same. The file is written where it is to stay: callers write into an
    action's temporary directory, which the runner moves into OUT whole."""

    def __init__(self, path: Path, dedupe: bool = True) -> None:
        self.path, self.dedupe = path, dedupe
        self._out = open(path, "wb")
        self._ranges: dict[tuple[str, int, int | None], tuple[int, int]] = {}  # source range -> (offset, length)
        self._digests: dict[str, tuple[int, int]] = {}  # sha256 of the bytes -> (offset, length)

    def __enter__(self) -> "SharedData":
        return self

    def __exit__(self, *exc: object) -> None:
        self._out.close()

    def save(self, model: Any, src_dir: Path, dst: Path, inline_max: int | None = None) -> None:
        """Save `model` as `dst` (beside this file) with its external tensors (read from `src_dir`) and its inline
        ones over `inline_max` bytes in this file."""
        import onnx
        from onnx.external_data_helper import uses_external_data

        for t in all_tensors(model):
            if uses_external_data(t):
                start, length = self._external(t, src_dir)
            elif inline_max is not None and t.HasField("raw_data") and len(t.raw_data) > inline_max:
                start, length = self._inline(t.raw_data)
                t.ClearField("raw_data")
                t.data_location = onnx.TensorProto.EXTERNAL
            else:
                continue
            del t.external_data[:]
            for k, v in (("location", self.path.name), ("offset", str(start)), ("length", str(length))):
                t.external_data.add(key=k, value=v)
        self._out.flush()
        onnx.save(model, str(dst))

    def _external(self, t: Any, src_dir: Path) -> tuple[int, int]:
        info = {e.key: e.value for e in t.external_data}
        source = (src_dir / info["location"]).resolve()
        offset, length = int(info.get("offset", 0)), int(info["length"]) if "length" in info else None
        where = (str(source), offset, length)
        if not self.dedupe or where not in self._ranges:
            digest = _range_digest(source, offset, length) if self.dedupe else None
            if digest not in self._digests:
                start = self._out.tell()
                with open(source, "rb") as f:
                    f.seek(offset)
                    self._written(digest, start, _copy_range(f, self._out, length))
            self._ranges[where] = self._digests[digest] if digest else (start, self._out.tell() - start)
        return self._ranges[where]

    def _inline(self, data: bytes) -> tuple[int, int]:
        digest = hashlib.sha256(data).hexdigest() if self.dedupe else None
        if digest in self._digests:
            return self._digests[digest]
        start = self._out.tell()
        self._out.write(data)
        self._written(digest, start, len(data))
        return start, len(data)

    def _written(self, digest: str | None, start: int, length: int) -> None:
        if digest is not None:
            self._digests[digest] = (start, length)


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
    import math

    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    out = {}
    for t in load(path, external_data=False).graph.initializer:
        if uses_external_data(t):
            info = {e.key: e.value for e in t.external_data}
            digest = _range_digest(path.parent / info["location"], int(info.get("offset", 0)),
                                   int(info["length"]) if "length" in info else None)
        else:
            digest = hashlib.sha256(t.raw_data if t.HasField("raw_data") else numpy_helper.to_array(t).tobytes()).hexdigest()
        out[t.name] = (t.data_type, math.prod(t.dims), digest)
    return out


def _range_digest(path: Path, offset: int, length: int | None) -> str:
    """sha256 of `length` bytes of `path` from `offset` (to the end if None), read 1 MB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        _copy_range(f, _Hasher(h), length)
    return h.hexdigest()


class _Hasher:
    """A write-only file over a hash object, for _copy_range."""

    def __init__(self, h: Any) -> None:
        self.h = h

    def write(self, data: bytes) -> None:
        self.h.update(data)
