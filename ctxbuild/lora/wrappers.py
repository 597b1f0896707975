"""The two wrappers of an alpha-switched binary (LoRA v3 as onnxruntime-qnn documents it) and the alpha map they carry.

The binary is compiled with quantized I/O (qnn/quantized_io.py: its graph takes and gives the codes the HTP uses).
`<recipe>_ctx_qio.onnx` is that compile's wrapper: the app feeds codes (uint16 at int16), and its metadata holds the
encodings, from which the map states the codes for off (0.0) and on (1.0). `<recipe>_ctx.onnx` (recommended) names
the same `_qnn.bin` with a QuantizeLinear per input and a DequantizeLinear per output around the EPContext node,
which run on the CPU EP: the app feeds `lora_alpha` as float 0.0-1.0 (a session must allow the CPU EP: no
`session.disable_cpu_ep_fallback`). Measured with onnxruntime-qnn 2.7.0: a plain float-I/O compile gives a binary
whose graph takes FLOAT_32 I/O (the quantization runs inside the HTP graph), hence the quantized-I/O compile.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.lora.alpha import read_map, stamp
from ctxbuild.qnn.quantized_io import KEY as QIO_KEY
from ctxbuild.qnn.quantized_io import quantize, read_metadata


def float_io_wrapper(wrapper: Path, qio: Path) -> None:
    """`wrapper`, compiled with quantized I/O, copied to `qio`; `wrapper` then gets a QuantizeLinear per quantized
    input and a DequantizeLinear per output around its EPContext node, from its recorded encodings: float I/O, the
    conversions on the CPU EP, the binary the same."""
    import shutil

    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    shutil.copyfile(wrapper, qio)
    model = onnx.load(str(wrapper), load_external_data=False)
    enc = read_metadata(model)
    g = model.graph
    ep = [n for n in g.node if n.op_type == "EPContext"]
    nodes = []
    for name, e in sorted(enc.items()):
        q = f"{name}/quantized"
        g.initializer.extend([numpy_helper.from_array(np.array(e["scale"], np.float32), f"{name}/scale"),
                              numpy_helper.from_array(np.array(e["zero_point"], e["dtype"]), f"{name}/zero_point")])
        if value := next((v for v in g.input if v.name == name), None):
            for n in ep:
                n.input[:] = [q if x == name else x for x in n.input]
            nodes.append(helper.make_node("QuantizeLinear", [name, f"{name}/scale", f"{name}/zero_point"], [q],
                                          name=f"{name}/quantize", domain="com.microsoft"))
        else:
            value = next(v for v in g.output if v.name == name)
            for n in ep:
                n.output[:] = [q if x == name else x for x in n.output]
            nodes.append(helper.make_node("DequantizeLinear", [q, f"{name}/scale", f"{name}/zero_point"], [name],
                                          name=f"{name}/dequantize", domain="com.microsoft"))
        typed = onnx.ValueInfoProto()  # the EPContext node's side keeps the quantized type: its inference needs it
        typed.CopyFrom(value)
        typed.name = q
        g.value_info.append(typed)
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for n in ep:  # the EP's own map (onnx name -> name in the binary), as qnn/wrap.py writes it for prebuilt binaries
        _override_names(n, {f"{name}/quantized": name for name in enc})
    quantize_first = [n for n in nodes if n.op_type == "QuantizeLinear"]
    rest = [n for n in g.node]
    del g.node[:]
    g.node.extend([*quantize_first, *rest, *[n for n in nodes if n.op_type == "DequantizeLinear"]])
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    kept = [p for p in model.metadata_props if p.key != QIO_KEY]  # float I/O now: no encodings for the caller to apply
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(wrapper))


def _override_names(node: Any, renamed: dict[str, str]) -> None:
    from onnx import helper

    pairs: dict[str, str] = {}
    for attr in list(node.attribute):
        if attr.name == "io_name_overrides":
            pairs = dict(kv.split("=", 1) for kv in attr.s.decode().split(";") if "=" in kv)
            node.attribute.remove(attr)
    pairs = {**{k: v for k, v in pairs.items() if k not in renamed.values()},
             **{new: pairs.get(old, old) for new, old in renamed.items()}}
    node.attribute.append(helper.make_attribute("io_name_overrides", "".join(f"{k}={v};" for k, v in sorted(pairs.items()))))


def carry_alpha_map(wrapper: Path, reference: Path) -> None:
    """Stamp the reference's alpha map into `wrapper`, with the values its `lora_alpha` takes for off and on."""
    import numpy as np
    import onnx

    ref = onnx.load(str(reference), load_external_data=False)
    alpha_map = read_map(ref)
    if alpha_map is None:
        return
    model = onnx.load(str(wrapper), load_external_data=False)
    enc = read_metadata(model).get(alpha_map["input"])
    if enc is None:
        alpha_map["codes"] = {"dtype": "float32", "off": 0.0, "on": 1.0}
    else:
        off, on = (int(quantize(np.float32(v), enc)) for v in (0.0, 1.0))
        alpha_map["codes"] = {"dtype": enc["dtype"], "off": off, "on": on, "scale": enc["scale"],
                              "zero_point": enc["zero_point"]}
    stamp(model, alpha_map)
    onnx.save(model, str(wrapper))


def alpha_feed(alpha_map: dict[str, Any], values: list[float]) -> Any:
    """`lora_alpha` for a wrapper from float values 0.0-1.0: as they are (float I/O) or as its codes."""
    import numpy as np

    codes = alpha_map["codes"]
    v = np.asarray(values, np.float32)
    if codes["dtype"] == "float32":
        return v
    return quantize(v, {"scale": codes["scale"], "zero_point": codes["zero_point"], "dtype": codes["dtype"]})
