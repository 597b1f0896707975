"""The optimum / torch.onnx exporter plug-in (ctxbuild/llm/exporters/torch_onnx.py) on the committed real exports
(tests/exports/*_optimum), graph level and fast; test_llm_exporters.py builds them end to end."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from ctxbuild.llm import exporters
from ctxbuild.llm.canonical import NotADecoder
from ctxbuild.llm.convention import check_decoder, load_decoder

EXPORTS = Path(__file__).parents[1] / "exports"
ROOT = Path(__file__).parents[2]


def test_each_export_is_taken_by_its_exporters_plug_in() -> None:
    for arch in ("llama", "qwen2", "phi3", "gemma"):
        assert exporters.detect(load_decoder(EXPORTS / f"{arch}_optimum" / "model.onnx")).name == "optimum / torch.onnx"
        assert exporters.detect(load_decoder(EXPORTS / f"{arch}_builder" / "model.onnx")).name == \
            "onnxruntime-genai model builder"
    # ctxbuild's own decoders are the canonical form already (one mask, rotary tables): the fallback
    assert exporters.detect(onnx.load(str(ROOT / "recipes" / "models" / "llama_tiny.onnx"))).name == "optimum"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3", "gemma"])
def test_the_canonical_form_has_one_mask_and_no_run_time_rotary(arch: str) -> None:
    """Gemma's export computes its positions (no position_ids input): the canonical form takes them as an input."""
    path = EXPORTS / f"{arch}_optimum" / "model.onnx"
    model = load_decoder(path)
    before = {n.op_type for n in model.graph.node}
    assert {"Sin", "Cos", "IsNaN"} <= before
    assert ("position_ids" in {i.name for i in model.graph.input}) == (arch != "gemma")
    canonical = exporters.detect(model).to_canonical(model, str(path.parent), 64)
    ops = {n.op_type for n in canonical.graph.node}
    assert not ops & {"Sin", "Cos", "IsNaN"}
    producers = {o: n for n in canonical.graph.node for o in n.output}
    adds = [producers[n.input[0]] for n in canonical.graph.node if n.op_type == "Softmax"]
    shared = set.intersection(*(set(a.input) for a in adds))  # what the static pass makes the mask input
    assert len(adds) == 4 and len(shared) == 1 and shared.pop().startswith("/model/attn_mask/")
    tables = [t for t in canonical.graph.initializer if t.name.endswith("/table")]
    assert len(tables) == 2 and all(list(t.dims) == [64, 16] for t in tables)  # cos and sin, CL rows x head_dim
    assert "position_ids" in {i.name for i in canonical.graph.input}
    onnx.checker.check_model(canonical)


def test_an_export_below_opset_13_is_refused() -> None:
    model = load_decoder(EXPORTS / "llama_optimum" / "model.onnx")
    model.opset_import[0].version = 12
    with pytest.raises(NotADecoder, match=r"opset 12: .*export with opset 14 or later"):
        check_decoder(model)


def test_phi3s_empty_rotary_pass_through_is_gone_from_the_static_graphs() -> None:
    """Phi-3 splits q and k at the rotary width (q[..., :rotary] rotated, q[..., rotary:] passed through) and its
    rotary covers the head: the second slice is empty, which QNN cannot hold. The static graph has no empty tensor
    and no Slice of a whole tensor."""
    from ctxbuild.llm.static import part_ranges, static_graph

    path = EXPORTS / "phi3_optimum" / "model.onnx"
    model = load_decoder(path)
    shape, convention = check_decoder(model), exporters.detect(model)
    canonical = convention.to_canonical(model, str(path.parent), 64)
    g = static_graph(canonical, shape, part_ranges(4, 2), 0, 1, 64, str(path.parent), fold=convention.fold_static)
    g = onnx.shape_inference.infer_shapes(g).graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*g.input, *g.value_info)}
    assert all(0 not in s for s in shapes.values())
    slices = [n for n in g.node if n.op_type == "Slice"]
    assert slices and all(shapes[n.input[0]] != shapes[n.output[0]] for n in slices)


def test_constants_saved_in_the_external_data_are_read(tmp_path: Path) -> None:
    """torch.onnx saving a model over 2 GB moves Constant nodes' values to the data file too (optimum's
    Qwen2.5-Coder-0.5B export: its rotary inv_freq): load_decoder reads them in (the rewrites read constants; the
    weights stay in the file), and the static graphs compute what the inline export's do."""
    import numpy as np
    from onnx.external_data_helper import uses_external_data

    from ctxbuild.graph.external_data import all_tensors
    from ctxbuild.llm import static
    from ctxbuild.llm.export_config import files
    from ctxbuild.llm.pipeline import Chain, cpu_runner

    inline = EXPORTS / "qwen2_optimum" / "model.onnx"
    external = tmp_path / "export" / "model.onnx"
    external.parent.mkdir()
    for name, path in files(inline).items():
        (external.parent / name).write_bytes(path.read_bytes())
    onnx.save_model(onnx.load(str(inline)), str(external), save_as_external_data=True, location="model.onnx_data",
                    size_threshold=0, convert_attribute=True)
    as_saved = onnx.load(str(external), load_external_data=False)
    assert any(uses_external_data(n.attribute[0].t) for n in as_saved.graph.node if n.op_type == "Constant")
    loaded = load_decoder(external)
    assert not any(uses_external_data(t) for t in all_tensors(loaded, initializers=False))
    assert all(uses_external_data(t) for t in loaded.graph.initializer)

    ids = np.load(EXPORTS / "qwen2_optimum" / "prompts" / "01.npy")
    logits = []
    for src in (inline, external):
        out = tmp_path / f"static-{src.parent.name}"
        out.mkdir()
        specs = static.specs(2, [16], [64])
        static.write_static_graphs(src, 2, [16], [64], {s.name: out / f"{s.name}.onnx" for s in specs},
                                   [out / static.weights_name(p, 2) for p in range(2)])
        run = cpu_runner({(s.part, s.ar, s.cl): out / f"{s.name}.onnx" for s in specs})
        logits.append(Chain(run, static.part_ranges(4, 2), (2, 16), 64).prefill(ids, 16))
    np.testing.assert_array_equal(logits[0], logits[1])
