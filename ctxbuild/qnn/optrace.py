"""The QNN EP's framework op trace: `qnn_op_trace.json`, which a compile writes when the provider option
`enable_framework_op_trace` is '1' (into `framework_op_trace_dir`; documented in onnxruntime-qnn's
QNN-ExecutionProvider.md, "QNN EP Framework Op Tracing"; in the library from onnxruntime-qnn 2.4.0, absent in 2.3.0).

What it adds to what ctxbuild knew (measured with 2.7.0):
- a failed compile writes it too: each node QNN refused with the EP's reason ("QNN doesn't support dynamic min/max.",
  "Einsum unsupported equation: ..."), which the EP's log at ctxbuild's level does not carry, and the refused nodes
  where the log names none (a graph QNN takes no node of);
- `subgraph_traces[].op_mappings`: the ONNX nodes each QNN op was made from (a GeluFusion's five nodes, one QNN Gelu).
Cost: the same binary and wrapper, byte for byte, and the same compile time with it (PP-OCRv6 detector, fp16, 0.84-0.87
s either way). The names are those of the graph the EP was given (graph/nodenames.named maps them to the user's)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

SINCE = (2, 4, 0)  # the release notes' "Framework op tracing" entry; 2.3.0's library has no such option
FILE = "qnn_op_trace.json"
# a reason that says no more than the op type does (the refusal names the op already)
_NO_REASON = re.compile(r"^Operators of type `[^`]*` are not supported by QNN EP")
_QDQ = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True)
class Fused:
    """One QNN op made from several ONNX nodes (by the names of the graph the EP was given)."""

    qnn_op: str  # the QNN op type: Gelu
    group: str  # the EP's fusion: GeluFusion
    nodes: tuple[str, ...]


def provider_options(trace_dir: Path) -> dict[str, str]:
    """The provider options that write the trace into `trace_dir`; {} on a toolchain without it (this process's
    onnxruntime-qnn: a provisioned toolchain's worker has its site first)."""
    from ctxbuild.toolchain.installed import version
    from ctxbuild.toolchain.runtimes import parse_version

    found = parse_version(version("onnxruntime-qnn"))
    if found is None or found < SINCE:
        return {}
    return {"enable_framework_op_trace": "1", "framework_op_trace_dir": str(trace_dir.absolute())}


def _read(trace_dir: Path | None) -> dict | None:
    if trace_dir is None:
        return None
    try:
        return json.loads((trace_dir / FILE).read_text())
    except (OSError, ValueError):  # not written: an older toolchain, or the EP failed before composing
        return None


def refused(trace_dir: Path | None) -> tuple[dict[tuple[str, str], str | None], set[tuple[str, str]]]:
    """(node, op type) -> the EP's reason for each node the trace says QNN refused (None: a reason that only says
    the op is not supported), and apart the quantizer's QuantizeLinear/DequantizeLinear refused with the same
    reason as a node refused on its own: QNN refuses a QDQ node unit whole, and the reason names its node."""
    trace = _read(trace_dir) or {}
    rows = [(u.get("node_name", ""), u.get("op_type", ""), (u.get("reason") or "").strip())
            for u in trace.get("unsupported_nodes", [])]
    own = {why for _, op, why in rows if op not in _QDQ}
    unit = {(name, op) for name, op, why in rows if op in _QDQ and why in own}
    return ({(name, op): (None if not why or _NO_REASON.match(why) else why.rstrip("."))
             for name, op, why in rows if (name, op) not in unit}, unit)


def fused(trace_dir: Path | None) -> list[Fused]:
    """The QNN ops made from more than one of the graph's compute nodes (a QDQ unit's QuantizeLinear and
    DequantizeLinear do not count), in the trace's order."""
    trace = _read(trace_dir) or {}
    out = []
    for graph in trace.get("subgraph_traces", []):
        for m in graph.get("op_mappings", []):
            nodes = tuple(s["name"] for s in m.get("sources", []) if s.get("type") == "OP"
                          and not re.search(r"_(Quantize|Dequantize)Linear(_\d+)?(/duplicated.*)?$", s["name"]))
            if len(nodes) > 1:
                out.append(Fused(m.get("dst_qnn_op_type", "?"), m.get("node_group_type", "?"), nodes))
    return out
