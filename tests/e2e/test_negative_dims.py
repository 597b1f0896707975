"""A dim stored as `dim_value: -1` (some exporters' way of writing "dynamic") is dynamic, as onnxruntime reads it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import records


def _conv_with_negative_batch(path: Path) -> None:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])
    x.type.tensor_type.shape.dim[0].dim_value = -1
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, 16, 16])
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "neg", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def test_negative_dim_is_fixed_by_the_recipe(tree: Path, tmp_path: Path, ctxbuild) -> None:
    for p in tree.glob("*.yaml"):
        if p.name != "_defaults.yaml":
            p.unlink()
    _conv_with_negative_batch(tree / "models" / "neg.onnx")
    (tree / "neg.yaml").write_text("model: models/neg.onnx\ninputs: {x: [1, 3, 16, 16]}\nprecision: fp16\n"
                                   "targets: [SM8650]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert records(out)["verify/neg@SM8650"]["result"]["passed"]

    (tree / "neg.yaml").write_text("model: models/neg.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 2  # a recipe error, found when planning
    assert "input 'x' of neg.onnx has dynamic dims [?, 3, 16, 16]" in r.err and "[1, 3, 16, 16]" in r.err, r.err
