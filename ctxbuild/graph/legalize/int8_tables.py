"""An int8 table read by data moves into a per-tensor DequantizeLinear -> the dequantized float table read the
same way.

`quantize_dynamic` stores embeddings as int8 tables: Gather(table, ids) (then Transpose, Reshape, ...) and a
DequantizeLinear by constant scale and zero point. QNN refuses the int8 Gather (Kokoro-82M's int8 export: its
text encoder's and BERT's embeddings). Moving values commutes with dequantizing them, so the float table read the
same way computes the same values: exact, unlike dynamic_int8's MatMuls, which drop the per-run activation
quantization. Its own rule, so the sample check keeps it where it withdraws dynamic_int8 (Kokoro's durations,
integers, move with that quantization)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "int8_tables"
OPS = ("DequantizeLinear",)
WHAT = "int8 tables read by Gather/Transpose/... into DequantizeLinear -> the dequantized float tables"
MOVES = ("Gather", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice")  # value-preserving


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    quantized = {n.input[0] for n in g.graph.node if n.op_type == "DequantizeLinear"}
    for name in sorted(quantized):
        # onnxruntime's optimizer gives each consumer its own copy of a DequantizeLinear: all must agree
        dqls = g.consumers.get(name, [])
        params = {_per_tensor(g, d) for d in dqls}
        if any(d.op_type != "DequantizeLinear" for d in dqls) or len(params) != 1 or None in params:
            continue
        if g.const(name) is not None:
            continue  # a weight DequantizeLinear (static QDQ): kept, the QDQ path reads it
        ((scale, zp),) = params
        if float_table(g, name, scale, zp):
            for d in dqls:
                g.replace_uses(d.output[0], name)
            done += 1
    return done


def float_table(g: GraphView, name: str, scale: float, zp: float) -> bool:
    """Make `name`, data moves of a constant int8 table, the same moves of (table - zp) * scale in float."""
    path = _moves_to_constant(g, name)
    if path is None:
        return False
    first, table = path
    value = (g.const(table).astype(np.float32) - np.float32(zp)) * np.float32(scale)
    first.input[0] = g.add_const(f"{table}_float", value)  # the moves after it follow in float
    return True


def _per_tensor(g: GraphView, dql: Any) -> tuple[float, float] | None:
    """(scale, zero point) of a per-tensor DequantizeLinear with constant parameters, else None."""
    scale = g.const(dql.input[1])
    zp = g.const(dql.input[2]) if len(dql.input) > 2 and dql.input[2] else np.zeros(())
    if scale is None or zp is None or scale.size != 1 or zp.size != 1:
        return None  # per-axis: the axis moves with Transpose/Gather; not a pattern seen
    return float(scale.item()), float(zp.item())


def _moves_to_constant(g: GraphView, name: str) -> tuple[Any, str] | None:
    """Walk back from a DequantizeLinear's input through data moves (each read only by the next) to a
    constant table: (the first move, the table's name), or None."""
    node = g.producer.get(name)
    while node is not None and node.op_type in MOVES:
        if g.const(node.input[0]) is not None:
            return node, node.input[0]
        node = g.producer.get(node.input[0])
        if node is not None and len(g.consumers.get(node.output[0], [])) != 1:
            return None
    return None
