"""mask_fill through data moves: torch's nn.TransformerEncoder export with a key padding mask (khmersm 1.4.2's
Khmer segmenter) writes Where(mask, zeros [1, L], -inf), then Reshape / Expand / Reshape to the heads' shape, then
Add to the scores and Softmax. The rule followed Adds only and left the -inf; every integer candidate then missed on
the CPU screen (w8a16 and w16a16 alike: cosine 0.826, 4.9 dB) and the search ended at fp16."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from ctxbuild.graph.legalize import legalize
from tests._qnn_models import TARGET, cosine, qnn_session
from tests.e2e.test_legalize import _int16, _model, _run, rng

L, H, D = 16, 2, 32


def _attention() -> onnx.ModelProto:
    r = rng()
    nodes = [helper.make_node("Where", ["mask", "zeros", "fill"], ["bias"]),
             helper.make_node("Reshape", ["bias", "s1"], ["b1"]), helper.make_node("Expand", ["b1", "s2"], ["b2"]),
             helper.make_node("Reshape", ["b2", "s3"], ["b3"]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Add", ["ss", "b3"], ["l"]), helper.make_node("Softmax", ["l"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    m = _model(nodes, {"q": [H, L, D]}, {"y": [H, L, D]},
               {"kt": r.standard_normal((H, D, L)).astype(np.float32), "scale": np.array(D ** -0.5, np.float32),
                "zeros": np.zeros((1, L), np.float32), "fill": np.array(-np.inf, np.float32),
                "s1": np.array([1, 1, 1, L], np.int64), "s2": np.array([1, H, 1, L], np.int64),
                "s3": np.array([H, 1, L], np.int64), "v": r.standard_normal((H, L, D)).astype(np.float32)})
    m.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, L]))
    return m


def test_mask_fill_through_reshape_and_expand(tmp_path: Path) -> None:
    m = _attention()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(m)
    assert legalize(rewritten).rewrites == {"mask_fill": 1}
    r = rng()
    samples = [{"q": (r.standard_normal((H, L, D)) * 2).astype(np.float32), "mask": np.arange(L)[None] < n}
               for n in (11, 16, 7, 13)]  # padded rows, as a batch pads them
    for s in samples:
        assert np.abs(_run(m, s)[0] - _run(rewritten, s)[0]).max() < 1e-6
    found: dict[str, float | None] = {}
    for name, model in (("original", m), ("rewritten", rewritten)):
        ctx = _int16(model, samples, tmp_path, name)
        found[name] = None if ctx is None else cosine(
            qnn_session(ctx, cpu_fallback=True, **TARGET).run(None, samples[0])[0], _run(m, samples[0])[0])
    assert (found["original"] or 0) < 0.9 and (found["rewritten"] or 0) > 0.999, found
