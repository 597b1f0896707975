"""The optimum / torch.onnx exporter plug-in (ctxbuild/llm/exporters/torch_onnx.py) on the committed real exports
(tests/exports/*_optimum), graph level and fast; test_llm_exporters.py builds them end to end."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from ctxbuild.llm import exporters
from ctxbuild.llm.canonical import NotADecoder
from ctxbuild.llm.convention import check_decoder, load_decoder

EXPORTS = Path(__file__).parent / "exports"
ROOT = Path(__file__).parents[1]


def test_each_export_is_taken_by_its_exporters_plug_in() -> None:
    for arch in ("llama", "qwen2"):
        assert exporters.detect(load_decoder(EXPORTS / f"{arch}_optimum" / "model.onnx")).name == "optimum / torch.onnx"
        assert exporters.detect(load_decoder(EXPORTS / f"{arch}_builder" / "model.onnx")).name == \
            "onnxruntime-genai model builder"
    # ctxbuild's own decoders are the canonical form already (one mask, rotary tables): the fallback
    assert exporters.detect(onnx.load(str(ROOT / "recipes" / "models" / "llama_tiny.onnx"))).name == "optimum"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_canonical_form_has_one_mask_and_no_run_time_rotary(arch: str) -> None:
    path = EXPORTS / f"{arch}_optimum" / "model.onnx"
    model = load_decoder(path)
    before = {n.op_type for n in model.graph.node}
    assert {"Sin", "Cos", "IsNaN"} <= before
    canonical = exporters.detect(model).to_canonical(model, str(path.parent), 64)
    ops = {n.op_type for n in canonical.graph.node}
    assert not ops & {"Sin", "Cos", "IsNaN"}
    producers = {o: n for n in canonical.graph.node for o in n.output}
    adds = [producers[n.input[0]] for n in canonical.graph.node if n.op_type == "Softmax"]
    shared = set.intersection(*(set(a.input) for a in adds))  # what the static pass makes the mask input
    assert len(adds) == 4 and len(shared) == 1 and shared.pop().startswith("/model/attn_mask/")
    tables = [t for t in canonical.graph.initializer if t.name.endswith("/table")]
    assert len(tables) == 2 and all(list(t.dims) == [64, 16] for t in tables)  # cos and sin, CL rows x head_dim
    onnx.checker.check_model(canonical)


def test_an_export_below_opset_13_is_refused() -> None:
    model = load_decoder(EXPORTS / "llama_optimum" / "model.onnx")
    model.opset_import[0].version = 12
    with pytest.raises(NotADecoder, match=r"opset 12: .*export with opset 14 or later"):
        check_decoder(model)
