"""EPContext wrappers older runtimes open: the lowest ONNX IR version and only the opset imports their nodes need.

onnxruntime 1.32 writes wrappers with IR 14 and a dozen internal opset domains; onnxruntime 1.24 (the oldest
the QNN plugin EP runs on) reads IR <= 13 and refuses them. A wrapper holds an EPContext node (com.microsoft 1)
and, around it, what stayed on the CPU: graph-I/O Q/DQ, split_outputs' Concats, with cpu_fallback any op.
Every path that writes a wrapper (compile, bundle, prebuilt/wrap) ends with `lower`.

- Opsets: only the domains nodes use. The default domain goes as low as every node allows. For ops whose
  versions only ever added types and attributes (Q/DQ, Concat: the ONNX changelog), the lowest version whose
  schema takes the node's attributes and types (and, for Q/DQ, a per-axis scale needs 13). For any other op,
  the version its current schema dates from: the same schema, so the same semantics. Other domains keep their
  version (com.microsoft ops are all version 1).
- IR: the lowest the content allows: 3 (opset imports), 4 with initializers (they may be graph inputs with
  defaults, LoRA's slots, only overridable from IR 4 in onnxruntime), at least what onnx's VERSION_TABLE says
  the opsets need, and what the data types need (the IR changelog in onnx.proto).
A pure function of the model: compiles stay byte-reproducible.
"""
from __future__ import annotations

import math
from pathlib import Path

import onnx
from onnx import TensorProto, defs, helper

# Ops whose later versions only add types/attributes (onnx/docs/Changelog.md): the lowest version accepting the
# node means the same computation.
_EXTENDING_ONLY = {"QuantizeLinear", "DequantizeLinear", "Concat"}
_PER_AXIS_SINCE = 13  # QuantizeLinear/DequantizeLinear-13 added per-axis scales (`axis`)
_NEGATIVE_AXIS_SINCE = 11  # Concat-11 accepts a negative axis
# onnxruntime guarantees ai.onnx only from opset 7 ("ONNX Runtime only *guarantees* support for models stamped
# with opset version 7 or above", measured 1.24.4; it has no Concat-1 kernel at all).
_ORT_MIN_OPSET = 7
_MIN_IR = 3  # opset_import (and NodeProto.domain) exist from IR 3 on
_INITIALIZER_IR = 4  # IR 4: initializers need not be graph inputs; onnxruntime overrides them only from 4 on
# onnx.proto: the IR version that introduced each data type (types not listed exist from IR 3 on).
_TYPE_IR = {
    TensorProto.BFLOAT16: 4,
    TensorProto.FLOAT8E4M3FN: 9, TensorProto.FLOAT8E4M3FNUZ: 9, TensorProto.FLOAT8E5M2: 9,
    TensorProto.FLOAT8E5M2FNUZ: 9, TensorProto.UINT4: 10, TensorProto.INT4: 10, TensorProto.FLOAT4E2M1: 11,
}
for _name, _ir in (("FLOAT8E8M0", 12), ("UINT2", 13), ("INT2", 13)):  # newer onnx releases only
    if hasattr(TensorProto, _name):
        _TYPE_IR[getattr(TensorProto, _name)] = _ir


def lower(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite `model`'s opset imports and IR version in place (and return it)."""
    declared = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    used = {n.domain or "ai.onnx" for n in model.graph.node}
    types = _element_types(model)
    sizes = {t.name: math.prod(t.dims) for t in model.graph.initializer}
    versions = {}
    for domain in sorted(used):
        if domain == "ai.onnx":
            current = declared.get(domain, defs.onnx_opset_version())
            versions[""] = max([_ORT_MIN_OPSET] + [_lowest_version(n, current, types, sizes) for n in model.graph.node
                                                   if (n.domain or "ai.onnx") == "ai.onnx"])
        else:
            versions[domain] = declared.get(domain, 1)
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(versions.items()))
    model.ir_version = _lowest_ir(model, types)
    return model


def lower_file(path: Path) -> None:
    """`lower` a wrapper on disk (an action's temp output: the runner places it atomically)."""
    model = onnx.load(str(path), load_external_data=False)
    onnx.save(lower(model), str(path))


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor name -> element type, from what the wrapper declares (EPContext has no type inference)."""
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)
             if v.type.HasField("tensor_type")}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def _lowest_version(node: onnx.NodeProto, current: int, types: dict[str, int], sizes: dict[str, int]) -> int:
    try:
        schema = defs.get_schema(node.op_type, current, "")
    except defs.SchemaError:  # an op onnx does not know: leave the version alone
        return current
    if node.op_type not in _EXTENDING_ONLY:
        return schema.since_version
    floor = _floor(node, sizes)
    for version in _schema_versions(node.op_type, schema.since_version):
        if version >= floor and _accepts(defs.get_schema(node.op_type, version, ""), node, types):
            return version
    return schema.since_version


def _schema_versions(op: str, up_to: int) -> list[int]:
    return sorted(s.since_version for s in defs.get_all_schemas_with_history()
                  if s.name == op and s.domain == "" and s.since_version <= up_to)


def _floor(node: onnx.NodeProto, sizes: dict[str, int]) -> int:
    """What the schemas do not say: attribute values and scale shapes newer versions brought."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    if node.op_type == "Concat":
        return _NEGATIVE_AXIS_SINCE if axis is not None and axis < 0 else 1
    # Per-axis: an `axis` attribute, or a scale of more than one value (one computed in the graph counts as such).
    return _PER_AXIS_SINCE if axis is not None or sizes.get(node.input[1], 2) > 1 else 1


def _accepts(schema: defs.OpSchema, node: onnx.NodeProto, types: dict[str, int]) -> bool:
    """The node's attributes exist in `schema` and its typed inputs/outputs fit the type constraints."""
    if any(a.name not in schema.attributes for a in node.attribute):
        return False
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for formals, actuals in ((schema.inputs, node.input), (schema.outputs, node.output)):
        for i, name in enumerate(actuals):
            if not name or name not in types or not formals:
                continue
            formal = formals[min(i, len(formals) - 1)]  # the last formal may be variadic
            if i >= len(formals) and formal.option != defs.OpSchema.FormalParameterOption.Variadic:
                return False
            ok = allowed.get(formal.type_str, {formal.type_str})
            if f"tensor({TensorProto.DataType.Name(types[name]).lower()})" not in ok:
                return False
    return True


def _lowest_ir(model: onnx.ModelProto, types: dict[str, int]) -> int:
    g = model.graph
    ir = max([_MIN_IR, helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)]
             + [_TYPE_IR.get(t, _MIN_IR) for t in types.values()])
    if g.initializer:
        ir = max(ir, _INITIALIZER_IR)
    if g.sparse_initializer:
        ir = max(ir, 6)  # IR 6: sparse initializers
    if model.functions:
        ir = max(ir, 10 if any(f.overload for f in model.functions) else 8)  # IR 8: local functions; 10: overloads
    if any(n.metadata_props for n in g.node) or g.metadata_props:
        ir = max(ir, 10)  # IR 10: metadata_props beyond ModelProto
    return min(ir, model.ir_version) if model.ir_version else ir
