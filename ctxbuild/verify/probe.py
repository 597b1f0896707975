"""The HTP's side of the per-layer diagnosis: a debug variant of the QDQ model whose chosen intermediate tensors
("probes") are extra graph outputs, compiled with the QNN EP and run on the HTP simulator.

A probe is a second DequantizeLinear on the tensor's QuantizeLinear output, made a graph output: the QNN graph
emits the tensor the HTP computed, while the nodes the HTP fuses keep their QDQ groups (the tensor a group reads
is untouched).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.errors import ActionError, cause_line


def probe_model(qdq: Any, tensors: list[str], shapes: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """The QDQ model with a second DequantizeLinear on each tensor's QuantizeLinear, made a graph output
    (in a model without QuantizeLinear, the tensor itself)."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(qdq)
    quantizer = {n.input[0]: n for n in m.graph.node if n.op_type == "QuantizeLinear"}
    outputs = {o.name for o in m.graph.output}
    probes: dict[str, str] = {}
    produced = {o for n in m.graph.node for o in n.output}
    for t in tensors:
        if t in outputs:
            probes[t] = t
            continue
        q = quantizer.get(t)
        if q is None:
            if not quantizer and t in produced:  # a float model (fp16 on the HTP): the tensor itself
                m.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, shapes.get(t)))
                probes[t] = t
            continue
        name = f"{t}__probe"
        m.graph.node.append(helper.make_node("DequantizeLinear", [q.output[0], *q.input[1:]], [name],
                                             name=name, **{a.name: helper.get_attribute_value(a) for a in q.attribute
                                                           if a.name == "axis"}))
        m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shapes.get(t)))
        probes[t] = name
    return m, probes


def htp_run(qdq_path: Path, tensors: list[str], shapes: dict[str, Any], samples: list[dict[str, np.ndarray]],
            compile_params: dict[str, Any], tmp: Path, timeout: float) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Compile the debug variant for the target and run it on the simulator: tensor -> HTP values."""
    import onnx

    from ctxbuild.qnn.compile import compile_graph
    from ctxbuild.graph.modelio import load
    from ctxbuild.verify.measure import simulate

    params = {**compile_params, "embed": False, "cpu_fallback": True}
    if params.get("split_outputs") is True:  # the graph's own outputs: a probe of a Concat is not one to split
        from ctxbuild.qnn.split_outputs import concat_outputs

        params["split_outputs"] = list(concat_outputs(load(qdq_path, external_data=False)))
    model, probes = probe_model(load(qdq_path), tensors, shapes)
    d = Path(tempfile.mkdtemp(prefix="probe-", dir=tmp))
    src, ctx = d / "debug.onnx", d / "debug_ctx.onnx"
    onnx.save(model, src)
    try:
        compile_graph(src, ctx, params, d)
    except ActionError:
        raise
    except Exception as e:  # noqa: BLE001 - ORT's exceptions are untyped
        raise ActionError(f"the debug build with {len(probes)} probe outputs did not compile: "
                          f"{cause_line(e, last=True, limit=200)}") from None
    got = simulate(ctx, samples, cpu_fallback=True, timeout=timeout)
    wrapper = onnx.load(str(ctx), load_external_data=False)
    facts = {"probes": len(probes), "partitions": sum(n.op_type == "EPContext" for n in wrapper.graph.node),
             "cpu_nodes": sum(n.op_type != "EPContext" for n in wrapper.graph.node)}
    return {t: got[p] for t, p in probes.items() if p in got}, facts
