"""Which side of the quantization costs a model: a part's QDQ graphs with every activation's QuantizeLinear ->
DequantizeLinear pair taken out and the weights' DequantizeLinear kept, so a chain over them measures the weights
alone (activations in float). llm_quality_cpu runs it when the QDQ parts fail a quality gate, and the report says
whether the weights keep the model and the activations' uint16 ranges lose it, or the weights lose it.

Its graphs run with SESSION_CONFIG: onnxruntime's CPU EP otherwise fuses a weight's DequantizeLinear and its
MatMul over a float activation into a dynamically quantized MatMul (8-bit activations: 0.03 off on
tests/unit/test_llm_weights_alone.py's graph). SmolLM2-135M at w8a16 (per-channel int8 weights, onnxruntime 1.32.0;
docs/llm-reference.md, Trained decoders): the QDQ parts 1.065x / 0.86 (perplexity ratio / agreement), the same
weights alone 1.001x / 0.98 (0.998x / 0.96 with that fusion)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.graph.modelio import SharedData, load

SESSION_CONFIG = {"session.disable_quant_qdq": "1"}  # onnxruntime's documented key: no QDQ fusions


def float_activations(model: Any) -> int:
    """Take out of `model` (in place) each QuantizeLinear -> DequantizeLinear pair over an activation: the
    DequantizeLinear becomes an Identity of the QuantizeLinear's input (the tensor keeps its name, a graph output
    too), a QuantizeLinear left with no reader goes. Returns how many pairs."""
    from onnx import helper

    inits = {i.name for i in model.graph.initializer}
    made = {o: n for n in model.graph.node for o in n.output}
    nodes, pairs = [], 0
    for n in model.graph.node:
        q = made.get(n.input[0]) if n.op_type == "DequantizeLinear" and n.input[0] not in inits else None
        if q is not None and q.op_type == "QuantizeLinear":
            nodes.append(helper.make_node("Identity", [q.input[0]], [n.output[0]], name=n.name))
            pairs += 1
        else:
            nodes.append(n)
    read = {i for n in nodes for i in n.input} | {o.name for o in model.graph.output}
    nodes = [n for n in nodes if not (n.op_type == "QuantizeLinear" and n.output[0] not in read)]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return pairs


def weights_alone(models: dict[tuple[int, int, int], Path], dst: Path) -> dict[tuple[int, int, int], Path]:
    """`models` [(part, ar, cl)] with float activations, written into `dst`: one weight file per part, its graphs
    pointing into it as the build's do."""
    out: dict[tuple[int, int, int], Path] = {}
    dst.mkdir(exist_ok=True)
    for part in sorted({k[0] for k in models}):
        with SharedData(dst / f"weights_{part + 1}.data") as data:
            for key in sorted(k for k in models if k[0] == part):
                m = load(models[key], external_data=False)
                if not float_activations(m):
                    raise ValueError(f"{models[key]}: no activation QuantizeLinear -> DequantizeLinear pair")
                out[key] = dst / models[key].name
                data.save(m, models[key].parent, out[key])
    return out
