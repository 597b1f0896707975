"""EPContext wrappers for a QNN context binary made elsewhere (QAIRT tools, another machine).

One `<graph>_ctx.onnx` per graph, shaped like the wrappers onnxruntime-qnn 2.7.0 writes itself:
an EPContext node (domain com.microsoft) named after the QNN graph, whose inputs/outputs carry the
QNN tensor names. A quantized QNN tensor gets, unless `quantized_io`, a QuantizeLinear before (or
DequantizeLinear after) the node; the node then sees `<name>_QuantizeLinear_Output` and
`io_name_overrides` maps that back to the QNN name, exactly as the EP writes it when graph-I/O
Q/DQ stay on the CPU (offload_graph_io_quantization with CPU fallback allowed).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ctxbuild import atomic
from ctxbuild.qnn.contextbin import EPCONTEXT_DOMAIN, read_binary_info
from ctxbuild.qnn.lower import lower
from ctxbuild.errors import InspectError

EP_SOURCE = "QNNExecutionProvider"
# Written at opset 21 / IR 10 (QuantizeLinear with 16- and 4-bit integers needs them), then lowered to what
# each wrapper's content needs (lower.py).
OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid(EPCONTEXT_DOMAIN, 1)]
IR_VERSION = 10
# protobuf cannot serialize a message of 2 GiB or more.
MAX_EMBED_BYTES = 2**31 - 2**20

PLAIN_TYPES = {
    "FLOAT_32": TensorProto.FLOAT, "FLOAT_16": TensorProto.FLOAT16,
    "BFLOAT_16": TensorProto.BFLOAT16, "FLOAT_64": TensorProto.DOUBLE,
    "INT_8": TensorProto.INT8, "INT_16": TensorProto.INT16, "INT_32": TensorProto.INT32,
    "INT_64": TensorProto.INT64, "UINT_8": TensorProto.UINT8, "UINT_16": TensorProto.UINT16,
    "UINT_32": TensorProto.UINT32, "UINT_64": TensorProto.UINT64, "BOOL_8": TensorProto.BOOL,
}
# Fixed-point QNN types -> (integer ONNX type, bits).
FIXED_TYPES = {
    "UFIXED_POINT_4": (TensorProto.UINT4, 4), "SFIXED_POINT_4": (TensorProto.INT4, 4),
    "UFIXED_POINT_8": (TensorProto.UINT8, 8), "SFIXED_POINT_8": (TensorProto.INT8, 8),
    "UFIXED_POINT_16": (TensorProto.UINT16, 16), "SFIXED_POINT_16": (TensorProto.INT16, 16),
    "SFIXED_POINT_32": (TensorProto.INT32, 32), "UFIXED_POINT_32": (TensorProto.UINT32, 32),
}
# QuantizeLinear-21 has no 32-bit integer output: such tensors can only be exposed raw.
_QUANTIZABLE = {TensorProto.UINT4, TensorProto.INT4, TensorProto.UINT8, TensorProto.INT8,
                TensorProto.UINT16, TensorProto.INT16}


def _copy_atomic(src: Path, dst: Path) -> None:
    """Stream `src` to a temp file beside `dst`, then rename: binaries can be gigabytes."""
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _file_name(graph_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", graph_name).lstrip(".") or "graph"


class _Names:
    """Hands out tensor names not used by any QNN I/O tensor or by each other."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def __call__(self, wanted: str) -> str:
        name, i = wanted, 1
        while name in self.taken:
            name, i = f"{wanted}_{i}", i + 1
        self.taken.add(name)
        return name


def _qparams(label: str, tensor: dict[str, Any], int_type: int, bits: int,
             names: _Names) -> tuple[list[TensorProto], dict[str, Any]]:
    """Scale/zero-point initializers (+ node attributes) for QuantizeLinear/DequantizeLinear.
    QNN: real = (q + offset) * scale, ONNX: real = (q - zero_point) * scale, so zp = -offset."""
    q = tensor["quantization"]
    unsupported = InspectError(f"{label}: {tensor['dtype']} with {q['encoding']} quantization has no "
                               "QuantizeLinear equivalent", "wrap it with quantized_io=True")
    # A narrower bitwidth inside the container (e.g. 4 bits in UFIXED_POINT_8) would need a
    # saturation QuantizeLinear cannot do.
    if q.get("bitwidth", bits) != bits or int_type not in _QUANTIZABLE:
        raise unsupported
    if q["encoding"] in ("SCALE_OFFSET", "BW_SCALE_OFFSET"):
        scales, offsets, attrs = np.float32(q["scale"]), np.int64(q["offset"]), {}
    elif q["encoding"] in ("AXIS_SCALE_OFFSET", "BW_AXIS_SCALE_OFFSET"):
        scales = np.asarray(q["scales"], np.float32)
        offsets, attrs = np.asarray(q["offsets"], np.int64), {"axis": q["axis"]}
    else:
        raise unsupported
    zero_points = -offsets
    signed = tensor["dtype"].startswith("SFIXED")
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if np.any(zero_points < lo) or np.any(zero_points > hi):
        raise InspectError(f"{label}: offset {offsets.tolist()} does not fit {tensor['dtype']}",
                           "wrap it with quantized_io=True")
    scale = numpy_helper.from_array(scales, names(f"{tensor['name']}_scale"))
    zp = helper.make_tensor(names(f"{tensor['name']}_zero_point"), int_type, list(zero_points.shape),
                            zero_points.reshape(-1).tolist())
    return [scale, zp], attrs


def _graph_model(bin_label: str, info: dict[str, Any], graph: dict[str, Any],
                 cache_attrs: dict[str, Any], quantized_io: bool) -> onnx.ModelProto:
    names = _Names({t["name"] for t in graph["inputs"] + graph["outputs"]})
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    overrides: list[str] = []
    ports: dict[str, list[str]] = {"inputs": [], "outputs": []}
    values: dict[str, list[onnx.ValueInfoProto]] = {"inputs": [], "outputs": [], "inner": []}
    for side in ("inputs", "outputs"):
        for t in graph[side]:
            label = f"{bin_label}: graph {graph['name']} {side[:-1]} {t['name']}"
            fixed = FIXED_TYPES.get(t["dtype"])
            if fixed is None and t["dtype"] not in PLAIN_TYPES:
                raise InspectError(f"{label}: QNN type {t['dtype']} has no ONNX equivalent")
            elem = fixed[0] if fixed else PLAIN_TYPES[t["dtype"]]
            if fixed is None or t["quantization"] is None or quantized_io:
                ports[side].append(t["name"])
                values[side].append(helper.make_tensor_value_info(t["name"], elem, t["dims"]))
                continue
            qparams, attrs = _qparams(label, t, *fixed, names)
            inits += qparams
            inner = names(f"{t['name']}_QuantizeLinear_Output")
            scale_zp = [p.name for p in qparams]
            if side == "inputs":
                nodes.append(helper.make_node("QuantizeLinear", [t["name"], *scale_zp], [inner],
                                              name=names(f"{t['name']}_QuantizeLinear"), **attrs))
            else:
                nodes.append(helper.make_node("DequantizeLinear", [inner, *scale_zp], [t["name"]],
                                              name=names(f"{t['name']}_DequantizeLinear"), **attrs))
            ports[side].append(inner)
            # EPContext has no type inference: its quantized outputs need declared types.
            values["inner"].append(helper.make_tensor_value_info(inner, elem, t["dims"]))
            overrides.append(f"{inner}={t['name']}")
            values[side].append(helper.make_tensor_value_info(t["name"], TensorProto.FLOAT, t["dims"]))
    spill_fill = max(((g["graph_blob"] or {}).get("spill_fill_buffer_size") or 0)
                     for g in info["graphs"])
    attrs = {
        "main_context": 1,
        **cache_attrs,
        "ep_sdk_version": info["build_id"] or "",
        "partition_name": graph["name"],
        "source": EP_SOURCE,
        "max_size": spill_fill,
        "is_multi_soc_ep_context": int(info["format"] == "multi_soc"),
    }
    if overrides:
        attrs["io_name_overrides"] = "".join(f"{o};" for o in overrides)
    nodes.insert(sum(n.op_type == "QuantizeLinear" for n in nodes), helper.make_node(
        "EPContext", ports["inputs"], ports["outputs"], name=graph["name"], domain=EPCONTEXT_DOMAIN,
        doc_string=f"EPContext node for {EP_SOURCE}", **attrs))
    g = helper.make_graph(nodes, graph["name"], values["inputs"], values["outputs"], inits,
                          value_info=values["inner"])
    return lower(helper.make_model(g, opset_imports=OPSETS, ir_version=IR_VERSION, producer_name="ctxbuild"))


def wrap_binary(bin_path: Path, out_dir: Path, *, embed: bool = False,
                quantized_io: bool = False) -> list[Path]:
    """Write `<graph>_ctx.onnx` into `out_dir` for every graph of the context binary `bin_path`
    and, unless `embed`, copy the binary next to them (the EPContext nodes name it relatively).
    Float I/O by default (Q/DQ around quantized QNN tensors); `quantized_io` exposes the
    integer tensors instead. Returns the wrapper paths in graph order."""
    bin_path, out_dir = Path(bin_path), Path(out_dir)
    if not bin_path.is_file():
        raise InspectError(f"{bin_path}: no such file", "check the path")
    info = read_binary_info(str(bin_path), path=bin_path)
    if not info["graphs"]:
        raise InspectError(f"{bin_path}: the context binary holds no graph", "rebuild it")
    files = [f"{_file_name(g['name'])}_ctx.onnx" for g in info["graphs"]]
    if len(set(files)) != len(files):
        raise InspectError(f"{bin_path}: graph names collide as file names: {files}",
                           "rename the graphs when generating the binary")
    if embed and bin_path.stat().st_size > MAX_EMBED_BYTES:
        raise InspectError(f"{bin_path}: {bin_path.stat().st_size} bytes cannot be embedded in an ONNX "
                           "file (2 GiB protobuf limit)", "wrap it with embed=False")
    cache_attrs: dict[str, Any] = (
        {"ep_cache_context": bin_path.read_bytes(), "embed_mode": 1} if embed
        else {"ep_cache_context": bin_path.name, "embed_mode": 0})
    # Build every wrapper before writing anything, so an unsupported tensor leaves no files behind.
    models = [_graph_model(str(bin_path), info, g, cache_attrs, quantized_io) for g in info["graphs"]]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / bin_path.name
        if not embed and not (target.exists() and target.samefile(bin_path)):
            _copy_atomic(bin_path, target)
        for model, name in zip(models, files):
            atomic.write_bytes(out_dir / name, model.SerializeToString())
    except OSError as e:
        raise InspectError(f"{e.filename or out_dir}: cannot write: {e.strerror}",
                           "check the output directory") from e
    return [out_dir / name for name in files]
