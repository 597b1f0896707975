"""ONNX external data read by ctxbuild itself rather than by onnx's loader, and private copies for the tools that
only take a path.

onnx (1.16 on) refuses to load a weight file that has more than one hard link ("a potential hardlink attack": a
planted link to a file the model's reader may read and its author may not) or that is a symbolic link. The local
cache shares OUT's files with its blobs by hard link (cache/local.py), `*.data` weight files included, so every
read of a model's weights in ctxbuild goes through `load_data` / `tensor_array` here: the same checks as onnx's
(the location a plain name inside the model's directory, a regular file, offset and length within it), and a file
with several links accepted only when it belongs to the user running the build (the cache's links always do: a
restore by link needs to own the blob); a link to another user's file is refused, as onnx refuses it.

onnxruntime's quantization tools read their input through onnx's loader by path: `PrivateData` gives them copies
of the linked files for the time they run. onnxruntime's own sessions (and onnxruntime-genai) take linked files.
"""
from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError


def all_tensors(model: Any, initializers: bool = True) -> Iterator[Any]:
    """Every TensorProto of the model that may hold external data (as onnx's loader walks them): initializers
    (unless not `initializers`) and tensor attributes, in subgraphs too."""
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        if initializers:
            yield from g.initializer
        for node in g.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)


def location(t: Any) -> tuple[str, int, int | None]:
    """The tensor's (location, offset, length); length None: to the end of the file."""
    info = {e.key: e.value for e in t.external_data}
    try:
        offset, length = int(info.get("offset", 0)), int(info["length"]) if "length" in info else None
    except ValueError:
        raise ActionError(f"tensor '{t.name}': external data offset/length are not integers",
                          "re-export the model") from None
    if offset < 0 or (length is not None and length < 0):
        raise ActionError(f"tensor '{t.name}': negative external data offset or length", "re-export the model")
    return info.get("location", ""), offset, length


def checked_location(model_path: Path, tensor: str, loc: str, follow_links: bool = False) -> Path:
    """Before anything reads it: inside the model's directory (no absolute path, no '..' out, no symlink
    out unless `follow_links`: the names as the model's directory lays them out, a Hugging Face cache's links to
    its blobs) and a regular file (not /dev/zero, a fifo or a directory) that is the user's own if it has
    several hard links (see the module's docstring)."""
    if follow_links:
        base = Path(os.path.abspath(model_path)).parent
        path = Path(os.path.normpath(base / loc))
    else:
        base = model_path.resolve().parent
        path = (base / loc).resolve()
    where = f"{model_path}: tensor '{tensor}': external data location '{loc}'"
    if not loc or Path(loc).is_absolute() or not path.is_relative_to(base):
        raise ActionError(f"{where} is outside the model's directory",
                          "keep external data files beside the model (onnx refuses other locations too)")
    try:
        st = path.stat()
    except OSError:
        raise ActionError(f"{where}: file not found ({path})", "keep the model's .data files next to it") from None
    if not stat.S_ISREG(st.st_mode):
        raise ActionError(f"{where} is not a regular file", "point it at the model's .data file")
    if st.st_nlink > 1 and st.st_uid != os.geteuid():
        raise ActionError(f"{where} has {st.st_nlink} hard links and belongs to another user",
                          "copy the model's files (onnx refuses such a link as a potential hardlink attack)")
    return path


class _Files:
    """Open data files by location, each checked once."""

    def __init__(self, model_path: Path, follow_links: bool) -> None:
        self.model_path, self.follow_links = model_path, follow_links
        self.open: dict[str, Any] = {}

    def read(self, t: Any) -> bytes:
        loc, offset, length = location(t)
        if loc not in self.open:
            self.open[loc] = open(checked_location(self.model_path, t.name, loc, self.follow_links), "rb")
        f = self.open[loc]
        size = os.fstat(f.fileno()).st_size
        end = size if length is None else offset + length
        if end > size:
            raise ActionError(f"{self.model_path}: tensor '{t.name}': external data [{offset}, {end}) is past the end "
                              f"of '{loc}' ({size} bytes)", "the .data file is truncated or not this model's")
        f.seek(offset)
        return f.read(end - offset)

    def close(self) -> None:
        for f in self.open.values():
            f.close()


def load_data(model: Any, model_path: Path, follow_links: bool = False, initializers: bool = True) -> None:
    """Fill every external tensor of `model` (read from `model_path` without its data) from its file, as onnx's
    load_external_data_for_model does: the bytes in raw_data, the tensor no longer external. Not `initializers`:
    only tensor attributes (Constant values) are filled, the weights stay where they are."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    files = _Files(model_path, follow_links)
    try:
        for t in all_tensors(model, initializers):
            if uses_external_data(t):
                t.raw_data = files.read(t)
                t.data_location = onnx.TensorProto.DEFAULT
                del t.external_data[:]
    finally:
        files.close()


def tensor_array(t: Any, model_path: Path, follow_links: bool = False) -> Any:
    """The tensor's value as numpy (onnx.numpy_helper.to_array, with external data read here)."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    if not uses_external_data(t):
        return numpy_helper.to_array(t)
    files = _Files(model_path, follow_links)
    try:
        filled = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims), raw_data=files.read(t))
    finally:
        files.close()
    return numpy_helper.to_array(filled)


class PrivateData:
    """Copies of the external data files with several hard links that models name, each made once beside its
    original for onnx's own loader (onnxruntime's quantization tools read their input through it) and removed on
    exit. A file with one link is used in place: without the cache's links nothing is copied (`always`: every
    file is copied, for a reader that met a link made after it looked)."""

    def __init__(self, always: bool = False) -> None:
        self.copies: dict[Path, Path | None] = {}  # data file -> its private copy (None: used in place)
        self.always = always

    def __enter__(self) -> "PrivateData":
        return self

    def __exit__(self, *exc: object) -> None:
        for copy in self.copies.values():
            if copy is not None:
                copy.unlink(missing_ok=True)

    def relocate(self, model: Any, model_path: Path) -> bool:
        """Point `model`'s tensors (loaded from `model_path` without data) whose file has several links at a
        private copy of it; True if any tensor moved."""
        from onnx.external_data_helper import uses_external_data

        moved = False
        for t in all_tensors(model):
            if not uses_external_data(t):
                continue
            path = checked_location(model_path, t.name, location(t)[0])
            if path not in self.copies:
                self.copies[path] = None
                if self.always or path.stat().st_nlink > 1:
                    self.copies[path] = path.with_name(f".{path.name}.private-{os.getpid()}-{next(_names)}")
                    shutil.copyfile(path, self.copies[path])  # in the kernel (sendfile); the copy has one link
            if (copy := self.copies[path]) is not None:
                for e in t.external_data:
                    if e.key == "location":
                        e.value = os.path.relpath(copy, model_path.resolve().parent)
                moved = True
        return moved


@contextmanager
def onnx_readable(model: Path, name: str, copy: bool = False) -> Iterator[Path]:
    """`model` as a private proto `name` beside it that onnx's loader takes (onnxruntime's quantization tools also
    write scratch files beside their input: actions sharing a model would race on them): a hard link to the
    proto, or where a data file has several links (every file, with `copy`), the proto pointing at private copies
    (PrivateData)."""
    import onnx

    src = model.with_name(name)
    with PrivateData(always=copy) as data:
        proto = onnx.load(str(model), load_external_data=False)
        if data.relocate(proto, model):
            onnx.save(proto, str(src))
        else:
            os.link(model, src)
        try:
            yield src
        finally:
            src.unlink(missing_ok=True)


_names = count()
