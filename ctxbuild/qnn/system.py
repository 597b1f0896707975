"""libQnnSystem.so: read the metadata of a QNN context binary, plain or a multi-SoC container, without loading it.

The library may crash on a corrupt file, so callers run this in a child process: `python -m ctxbuild.qnn.system
FILE|-` prints the info as JSON (`-` reads stdin). The structs are in tensor_abi.py and system_abi.py; turning
them into plain data is binaryinfo.py.
"""
from __future__ import annotations

import ctypes as C
import io
import json
import mmap
import os
import struct
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from ctxbuild.errors import InspectError
from ctxbuild.qnn.binaryinfo import extract
from ctxbuild.qnn.system_abi import (
    QNN_SUCCESS, ErrorHandle, Handle, QnnSystemContext_BinaryInfo_t, QnnSystemInterface_t,
)
from ctxbuild.toolchain import installed as toolchain

ZIP_MAGIC = b"PK\x03\x04"


def library_path() -> Path:
    """libQnnSystem.so as shipped next to the QNN EP in the onnxruntime-qnn wheel."""
    try:
        return toolchain.qnn_library_dir() / "libQnnSystem.so"
    except metadata.PackageNotFoundError as e:
        raise InspectError("onnxruntime-qnn is not installed", "pip install onnxruntime-qnn") from e


def _interface() -> QnnSystemInterface_t:
    try:
        lib = C.CDLL(str(library_path()))
    except OSError as e:
        raise InspectError(f"cannot load {library_path()}: {e}", "reinstall onnxruntime-qnn") from e
    get_providers = lib.QnnSystemInterface_getProviders
    get_providers.restype = ErrorHandle
    get_providers.argtypes = [
        C.POINTER(C.POINTER(C.POINTER(QnnSystemInterface_t))), C.POINTER(C.c_uint32),
    ]
    providers = C.POINTER(C.POINTER(QnnSystemInterface_t))()
    count = C.c_uint32()
    if get_providers(C.byref(providers), C.byref(count)) != QNN_SUCCESS or count.value == 0:
        raise InspectError(f"{library_path()}: QnnSystemInterface_getProviders failed")
    iface = providers[0].contents
    if iface.systemApiVersion.major != 1:
        raise InspectError(
            f"{library_path()}: QNN system API {iface.systemApiVersion.major}.x is not supported",
            "use onnxruntime-qnn 2.x",
        )
    return iface


_COMMON_KEYS = ("backend_id", "backend", "build_id", "core_api_version", "backend_api_version", "graphs")


def _context_info(data: bytes | mmap.mmap, label: str) -> dict[str, Any]:
    """libQnnSystem's view of one plain context binary. May crash the process on corrupt input."""
    iface = _interface().v1
    handle = Handle()
    if iface.systemContextCreate(C.byref(handle)) != QNN_SUCCESS:
        raise InspectError(f"{library_path()}: QnnSystemContext_create failed")
    try:
        # A private file mapping is writable, so ctypes can use it in place: no copy of a multi-GB binary.
        wrap = C.c_uint8 * len(data)
        buf = wrap.from_buffer(data) if isinstance(data, mmap.mmap) else wrap.from_buffer_copy(data)
        info = C.POINTER(QnnSystemContext_BinaryInfo_t)()
        info_size = C.c_uint64()
        err = iface.systemContextGetBinaryInfo(handle, buf, len(data), C.byref(info), C.byref(info_size))
        if err != QNN_SUCCESS or not info:
            raise InspectError(
                f"{label}: not a readable QNN context binary (libQnnSystem error {err})",
                "the file is corrupt, truncated or not a context binary; rebuild it",
            )
        return extract(info.contents)
    finally:
        iface.systemContextFree(handle)
        buf = None  # release the mapping now, even when a traceback keeps this frame: mmap.close() needs that


def _zip_entries(data: bytes | mmap.mmap, label: str) -> list[tuple[str, bytes]]:
    """Entries of a multi-SoC container. QNN writes them stored with zero CRCs, so zipfile lists
    them but refuses to read them: take the bytes after each local header instead."""
    try:
        infos = zipfile.ZipFile(io.BytesIO(data) if isinstance(data, bytes) else data).infolist()
    except (zipfile.BadZipFile, OSError) as e:
        raise InspectError(f"{label}: damaged multi-SoC container ({e})", "rebuild it") from e
    entries = []
    for zi in infos:
        start = zi.header_offset + 30
        name_len, extra_len = struct.unpack_from("<HH", data, zi.header_offset + 26)
        body = data[start + name_len + extra_len:start + name_len + extra_len + zi.file_size]
        if zi.compress_type != zipfile.ZIP_STORED or len(body) != zi.file_size:
            raise InspectError(f"{label}: entry {zi.filename} of the multi-SoC container is unreadable",
                               "rebuild it")
        entries.append((zi.filename, body))
    return entries


def _cache_names(entries: list[tuple[str, bytes]], label: str) -> set[str]:
    """The per-SoC context members a container's index lists (empty without an index)."""
    for name, body in entries:
        if name.startswith("dlc.metadata"):
            try:
                return {c["cacheName"] for c in json.loads(body)["cacheList"]}
            except (ValueError, KeyError, TypeError) as e:
                raise InspectError(f"{label}: unreadable index {name} in the multi-SoC container ({e})",
                                   "rebuild it") from None
    return set()


def binary_info_from_bytes(data: bytes | mmap.mmap, label: str = "<bytes>") -> dict[str, Any]:
    """Metadata of a context binary given as bytes (see `binary_info`)."""
    if not data:
        raise InspectError(f"{label}: file is empty", "rebuild the context binary")
    if data[:4] != ZIP_MAGIC:
        flat = _context_info(data, label)
        common = {k: flat.pop(k) for k in _COMMON_KEYS}
        return {"format": "context_binary", "file_size": len(data), **common,
                "targets": [{"entry": None, **flat}], "entries": None}
    # Multi-SoC ("flexible") binary: a zip of one plain context per SoC, shared weights and a JSON index
    # (`dlc.metadata<version>`) whose cacheList names the per-SoC members: `htp.cache.sm8650.0` from
    # onnxruntime-qnn 2.6.0, `backend.metadata0` from 2.5.0. libQnnSystem reads those members, not the container.
    entries = _zip_entries(data, label)
    listed = _cache_names(entries, label)
    caches = [(name, body) for name, body in entries if name in listed]
    if not caches:
        raise InspectError(f"{label}: zip file without QNN context caches", "pass a QNN context binary")
    targets, common = [], {}
    for name, body in caches:
        flat = _context_info(body, f"{label}:{name}")
        # Every cache holds the same graphs (one compile per SoC); keep the first's.
        common = common or {k: flat[k] for k in _COMMON_KEYS}
        targets.append({"entry": name, **{k: v for k, v in flat.items() if k not in _COMMON_KEYS}})
    return {"format": "multi_soc", "file_size": len(data), **common, "targets": targets,
            "entries": [{"name": name, "size": len(body)} for name, body in entries]}


def binary_info(path: Path) -> dict[str, Any]:
    """Metadata of the context binary at `path`, as plain JSON-able data:

    format ("context_binary" or "multi_soc"), file_size, backend_id/backend, build_id (SDK build),
    core_api_version, backend_api_version, graphs (name, inputs/outputs with dtype, dims and
    quantization, graph_blob with HTP spill-fill/VTCM/sizes), targets (one per compiled SoC:
    soc_model, soc_name, htp_arch, context_blob_version/size, platform, ...) and, for multi-SoC
    containers, entries (name and size of each member).
    """
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return binary_info_from_bytes(b"", str(path))
            # Mapped, not read: only the pages libQnnSystem touches become resident.
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as data:
                return binary_info_from_bytes(data, str(path))
    except OSError as e:
        raise InspectError(f"{path}: cannot read: {e.strerror}", "check the path") from e


def main(argv: list[str]) -> int:
    """Child-process entry point. Prints one JSON object on stdout: the info, or
    {"error": message, "hint": hint} with exit code 3."""
    if len(argv) != 1:
        print("usage: python -m ctxbuild.qnn.system FILE|-", file=sys.stderr)
        return 2
    # libQnnSystem may print to stdout; keep the real stdout for the JSON only.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    code = 0
    try:
        if argv[0] == "-":
            result = binary_info_from_bytes(sys.stdin.buffer.read(), "<stdin>")
        else:
            result = binary_info(Path(argv[0]))
    except InspectError as e:
        result, code = {"error": e.message, "hint": e.hint}, 3
    json.dump(result, out)
    out.close()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
