"""`inspect`: describe a QNN context binary, or the EPContext model wrapping one, without loading it.

libQnnSystem runs in a child process (`python -m ctxbuild.qnn.system`) with a timeout, so a
corrupt file can at worst kill that child. Nothing here loads a context for execution: the x86
HTP simulator segfaults on multi-graph (weight-shared) contexts.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from ctxbuild.errors import InspectError
from ctxbuild.units import fmt_size

CHILD_TIMEOUT_S = 60.0
EPCONTEXT_DOMAIN = "com.microsoft"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding ctxbuild/


def read_binary_info(label: str, *, path: Path | None = None, data: bytes | None = None,
                     timeout: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """`ctxbuild.qnn.system.binary_info` of a file (`path`) or of bytes (`data`), run in a child."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "ctxbuild.qnn.system", str(path) if path is not None else "-"]
    try:
        proc = subprocess.run(cmd, input=data, stdin=None if data is not None else subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise InspectError(f"{label}: libQnnSystem did not finish reading it in {timeout:.0f} s",
                           "the file is probably corrupt; rebuild it") from e
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        raise InspectError(f"{label}: libQnnSystem crashed ({sig}) reading it",
                           "the file is corrupt or truncated; rebuild it")
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        raise InspectError(f"{label}: inspector failed (exit {proc.returncode}): "
                           f"{lines[-1] if lines else 'no output'}") from None
    if "error" in result:
        raise InspectError(result["error"], result["hint"])
    return result


def _load_onnx(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except (OSError, ValueError, DecodeError) as e:
        raise InspectError(f"{path}: not a readable ONNX model ({type(e).__name__})",
                           "pass a .bin or an EPContext _ctx.onnx") from e


def _value_info(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    t = vi.type.tensor_type
    return {
        "name": vi.name,
        "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else None,
        "shape": [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim],
    }


def _embed_mode(node: onnx.NodeProto) -> int:
    # onnxruntime-qnn treats a missing embed_mode as 1.
    return next((a.i for a in node.attribute if a.name == "embed_mode"), 1)


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """Node attributes as plain values; an embedded context is replaced by its size."""
    attrs: dict[str, Any] = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        if a.name == "ep_cache_context" and _embed_mode(node) == 1:
            value = f"<{len(value)} bytes embedded>"
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        attrs[a.name] = value
    return attrs


def _describe_onnx(path: Path, timeout: float) -> dict[str, Any]:
    model = _load_onnx(path)
    nodes = [n for n in model.graph.node if n.op_type == "EPContext" and n.domain == EPCONTEXT_DOMAIN]
    if not nodes:
        raise InspectError(f"{path}: no EPContext node, so not a compiled model",
                           "compile it first, or pass the context .bin")
    problems: list[str] = []
    binaries: dict[str, dict[str, Any]] = {}  # source -> info, in node order
    node_infos = []
    for node in nodes:
        attrs = _attributes(node)
        source = None
        cache = next((a for a in node.attribute if a.name == "ep_cache_context"), None)
        if cache is not None and _embed_mode(node) == 1:
            source = f"embedded in node {node.name}"
            if source not in binaries:
                binaries[source] = read_binary_info(f"{path}:{node.name}", data=cache.s, timeout=timeout)
        elif cache is not None:
            rel = cache.s.decode("utf-8", "replace")
            if PurePosixPath(rel).is_absolute() or ".." in rel:
                problems.append(f"node {node.name}: ep_cache_context {rel!r} is absolute or contains "
                                "'..', which onnxruntime-qnn refuses to load")
            bin_path = path.parent / rel
            source = str(bin_path)
            if not bin_path.is_file():
                raise InspectError(f"{path}: node {node.name} needs {bin_path}, which does not exist",
                                   "put the .bin next to the .onnx")
            if source not in binaries:
                binaries[source] = read_binary_info(str(bin_path), path=bin_path, timeout=timeout)
        node_infos.append({"name": node.name, "inputs": list(node.input), "outputs": list(node.output),
                           "attributes": attrs, "binary": source})
    graph_names = {g["name"] for info in binaries.values() for g in info["graphs"]}
    for n in node_infos:
        partition = n["attributes"].get("partition_name")
        if partition is not None and partition not in graph_names:
            problems.append(f"node {n['name']}: partition_name {partition!r} is not a graph of its binary")
    defaults = {t.name for t in model.graph.initializer}
    wrapper = {
        "ir_version": model.ir_version,
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        # an input with an initializer of its name is optional: LoRA slots carry their defaults so
        "inputs": [{**_value_info(v), **({"optional": True} if v.name in defaults else {})} for v in model.graph.input],
        "outputs": [_value_info(v) for v in model.graph.output],
        "other_nodes": [n.op_type for n in model.graph.node if n not in nodes],
        "nodes": node_infos,
        "metadata": {p.key: p.value for p in model.metadata_props},
        "problems": problems,
    }
    return {"path": str(path), "kind": "onnx", "wrapper": wrapper,
            "binaries": [{"source": s, **info} for s, info in binaries.items()]}


def describe(path: Path, *, timeout: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """Plain-data description of a context `.bin` or an EPContext `.onnx`:
    {path, kind ("bin"|"onnx"), binaries: [{source, **qnn_system.binary_info}], wrapper}.
    `wrapper` (onnx only) lists the model I/O, the EPContext nodes with their attributes (an
    embedded blob shows as its size), metadata and problems onnxruntime-qnn would trip on."""
    path = Path(path)
    if path.is_dir():
        raise InspectError(f"{path}: a directory", "give a context binary (.bin) or an EPContext model (_ctx.onnx)")
    if not path.is_file():
        raise InspectError(f"{path}: no such file", "check the path")
    if path.suffix.lower() == ".onnx":
        return _describe_onnx(path, timeout)
    info = read_binary_info(str(path), path=path, timeout=timeout)
    return {"path": str(path), "kind": "bin", "wrapper": None,
            "binaries": [{"source": str(path), **info}]}


# ---------------------------------------------------------------------------------------------
# Text rendering


def _quant_text(q: dict[str, Any] | None) -> str:
    if q is None:
        return "-"
    if "scale" in q:
        bw = f" bw={q['bitwidth']}" if "bitwidth" in q else ""
        return f"scale={q['scale']:.6g} offset={q['offset']}{bw}"
    if "axis" in q and "scales" in q:
        return f"{q['encoding'].lower()} axis={q['axis']} ({len(q['scales'])} scales)"
    return q["encoding"].lower()


def _table(rows: list[list[str]], indent: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _target_text(t: dict[str, Any]) -> str:
    soc = (f"{t['soc_name'] or 'soc'} (soc_model {t['soc_model']})" if t["soc_model"]
           else "SoC not recorded")
    arch = f"HTP v{t['htp_arch']}" if t["htp_arch"] else "arch not recorded"
    where = f"{t['entry']}: " if t["entry"] else ""
    return (f"{where}{soc}, {arch}; context blob v{t['context_blob_version']}, "
            f"{fmt_size(t['context_blob_size'])}")


def _binary_text(b: dict[str, Any]) -> list[str]:
    kind = "multi-SoC container" if b["format"] == "multi_soc" else "context binary"
    lines = [f"{kind} {b['source']} ({fmt_size(b['file_size'])})",
             f"  backend:    {b['backend']} (id {b['backend_id']}), core API {b['core_api_version']}, "
             f"backend API {b['backend_api_version']}",
             f"  SDK build:  {b['build_id']}"]
    lines += [f"  target:     {_target_text(t)}" for t in b["targets"]]
    for g in b["graphs"]:
        blob = g["graph_blob"] or {}
        extra = [f"{label} {fmt_size(blob[key])}" for key, label in
                 (("spill_fill_buffer_size", "spill-fill"), ("vtcm_bytes", "VTCM"),
                  ("shared_weights_size", "shared weights")) if key in blob]
        lines.append(f"  graph {g['name']}: {len(g['inputs'])} in, {len(g['outputs'])} out"
                     + (f"; {', '.join(extra)}" if extra else ""))
        rows = [["", "name", "dtype", "shape", "quantization"]]
        rows += [[io, t["name"] or "?", t["dtype"], "x".join(map(str, t["dims"])) or "scalar",
                  _quant_text(t["quantization"])]
                 for io, ts in (("in", g["inputs"]), ("out", g["outputs"]), ("upd", g.get("updateable_tensors") or []))
                 for t in ts]
        lines += _table(rows, "    ")
        if g.get("updateable_tensors"):  # LoRAv2: what QnnContext_applyBinarySection may replace
            lines.append(f"    {len(g['updateable_tensors'])} updateable tensor(s) (upd): LoRAv2 adapter sections apply here")
    return lines


def format_text(info: dict[str, Any]) -> str:
    """Human-readable listing of `describe()`'s result."""
    lines: list[str] = []
    w = info["wrapper"]
    if w is not None:
        others = "".join(f", {n} {op}" for op, n in Counter(w["other_nodes"]).items())
        lines.append(f"EPContext model {info['path']} ({len(w['nodes'])} EPContext{others})")
        rows = [[io, v["name"], v["dtype"] or "?", "x".join(map(str, v["shape"])) or "scalar",
                 "optional (default in the wrapper: an adapter slot)" if v.get("optional") else ""]
                for io, vs in (("in", w["inputs"]), ("out", w["outputs"])) for v in vs]
        lines += _table(rows, "    ")
        for n in w["nodes"]:
            attrs = ", ".join(f"{k}={v}" for k, v in n["attributes"].items())
            lines.append(f"  node {n['name']}: {attrs}")
        lines += [f"  problem: {p}" for p in w["problems"]]
    for b in info["binaries"]:
        lines += _binary_text(b)
    return "\n".join(lines)
