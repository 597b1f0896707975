"""`compile.quantized_io`: a wrapper whose graph inputs and outputs carry the quantized types the HTP uses.

The QDQ model's QuantizeLinear right after a float graph input and DequantizeLinear right before a graph
output are removed before compiling (names stay); ModelCompiler then gives the EPContext wrapper uint8/uint16
I/O (measured with onnxruntime-qnn 2.7.0), and the app skips a float conversion on the CPU per tensor. Each
removed node's scale and zero point go into the wrapper's metadata (`ctxbuild.quantized_io`, JSON, read with
`InferenceSession.get_modelmeta().custom_metadata_map`): the verification quantizes its float samples and
dequantizes outputs with them, and LoRA adapters bound to quantized slots are quantized the same way.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ctxbuild.errors import ActionError

if TYPE_CHECKING:
    import numpy as np

KEY = "ctxbuild.quantized_io"
Encodings = dict[str, dict[str, Any]]  # tensor -> {"scale", "zero_point", "dtype"}


def strip(model: Any) -> Encodings:
    """Remove the boundary Q/DQ nodes of `model` (in place); returns their encodings by tensor name."""
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    encodings: Encodings = {}
    for inp in g.input:
        users = consumers.get(inp.name, [])
        if inp.name in inits or len(users) != 1 or users[0].op_type != "QuantizeLinear":
            continue  # not a plain float input quantized once: it stays float
        q = users[0]
        encodings[inp.name] = _encoding(q, inits, numpy_helper)
        for n in consumers.get(q.output[0], []):
            n.input[:] = [inp.name if x == q.output[0] else x for x in n.input]
        g.node.remove(q)
        inp.type.tensor_type.elem_type = inits[q.input[2]].data_type
    producers = {o: n for n in g.node for o in n.output}
    for out in g.output:
        dq = producers.get(out.name)
        if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 3:
            continue
        encodings[out.name] = _encoding(dq, inits, numpy_helper)
        quantized = dq.input[0]
        g.node.remove(dq)
        for n in g.node:  # the quantized tensor takes the output's name
            n.input[:] = [out.name if x == quantized else x for x in n.input]
            n.output[:] = [out.name if x == quantized else x for x in n.output]
        out.type.tensor_type.elem_type = inits[dq.input[2]].data_type
    return encodings


def _encoding(node: Any, inits: dict[str, Any], numpy_helper: Any) -> dict[str, Any]:
    scale, zp = (inits.get(node.input[1]), inits.get(node.input[2]) if len(node.input) > 2 else None)
    if scale is None or zp is None or numpy_helper.to_array(scale).size != 1:
        raise ActionError(f"{node.name or node.op_type}: graph I/O quantized per axis or without a constant zero "
                          "point cannot become quantized I/O", "remove compile.quantized_io")
    zero = numpy_helper.to_array(zp)
    return {"scale": float(numpy_helper.to_array(scale)), "zero_point": int(zero), "dtype": str(zero.dtype)}


def write_metadata(model: Any, encodings: Encodings) -> None:
    model.metadata_props.add(key=KEY, value=json.dumps(encodings, sort_keys=True))


def read_metadata(model: Any) -> Encodings:
    """The wrapper's quantized I/O, {} for float I/O."""
    for p in model.metadata_props:
        if p.key == KEY:
            return json.loads(p.value)
    return {}


def quantize(value: np.ndarray, enc: dict[str, Any]) -> np.ndarray:
    import numpy as np

    info = np.iinfo(enc["dtype"])
    q = np.round(value.astype(np.float64) / enc["scale"]) + enc["zero_point"]
    return np.clip(q, info.min, info.max).astype(enc["dtype"])


def dequantize(value: np.ndarray, enc: dict[str, Any]) -> np.ndarray:
    import numpy as np

    return ((value.astype(np.float64) - enc["zero_point"]) * enc["scale"]).astype(np.float32)
