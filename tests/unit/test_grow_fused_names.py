"""The mixed rung's growing rounds on a prepared model where two of the user's nodes are one node (onnxruntime fuses
a MatMul and the Add of its bias into a Gemm): a round that pinned one name from the diagnosis and the other from
the pool gave the one node two settings, quantize refused the set as the recipe's mistake ("'node_MatMul_231' and
'node_linear_6' are one node after prepare's rewrites ... with different settings", naming a recipe that has no
quantization.nodes) and the search dropped its mixed candidate (khmersm 1.4.2's Khmer segmenter)."""
from __future__ import annotations

import json

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.actions.quantize import pinned_nodes
from ctxbuild.graph.nodenames import KEY
from ctxbuild.recipes.quantization import FP16_NODE
from ctxbuild.verify.grow import grow


def _prepared() -> object:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    relus = [helper.make_node("Relu", [f"h{i}"], [f"h{i + 1}" if i < 5 else "y"], name=f"relu{i}") for i in range(6)]
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["h0"], name="fused"), *relus], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, b])
    model = helper.make_model(graph)
    model.metadata_props.add(key=KEY, value=json.dumps({"became": {"mm": ["fused"], "linear": ["fused"]},
                                                        "from": {"fused": ["mm", "linear"]}}))
    return model


def test_growing_gives_one_node_one_setting() -> None:
    model = _prepared()
    measured = []

    def measure(nodes: dict) -> dict:
        pinned_nodes(model, nodes, "r.yaml")  # raised: one node, two settings
        measured.append(nodes)
        return {"outputs": {"y": {"cosine": 0.5, "snr_db": 3.0}}}

    first = {"mm": {"weights": "int16"}}  # the diagnosis named the MatMul; the pool names the node by the Add
    nodes, rounds, why = grow(model, first, {"y"}, False, measure, {"min_cosine": 0.99, "min_snr_db": 20.0}, 2.5)
    assert why and len(measured) == len(rounds) > 1
    assert all(len({json.dumps(n[k], sort_keys=True) for k in ("mm", "linear") if k in n}) == 1 for n in measured)
    assert any(n.get("linear") == FP16_NODE and n.get("mm") == FP16_NODE for n in measured), measured
