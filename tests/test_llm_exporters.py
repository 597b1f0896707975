"""Decoders as the real exporters write them (tests/exports/: onnxruntime-genai 0.18.0's model builder and
optimum-onnx 0.1.0's `optimum-cli export onnx --task text-generation-with-past` (torch.onnx) run on tiny Llama and
Qwen2 checkpoints, committed as written) built unedited by an `llm:` recipe on two SoCs, and the genai_config.json
the build ships run by onnxruntime-genai on its CPU twin against the original export's tokens.

The Llama export's `model.onnx.data` is a symlink into another directory (a Hugging Face cache's layout), which
onnx and onnxruntime refuse to read directly."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

og = pytest.importorskip("onnxruntime_genai")
pytestmark = pytest.mark.e2e

EXPORTS = Path(__file__).parent / "exports"
EXPORTERS = ("llama_builder", "qwen2_builder", "llama_optimum", "qwen2_optimum")  # tests/exports/<arch>_<exporter>
SOCS = ["SM8650", "SM8750"]
GENERATE = 8


def _lay_out(arch: str, d: Path) -> Path:
    """The export as a user has it: the Llama builder's with its weights behind a symlink."""
    export = d / "export"
    shutil.copytree(EXPORTS / arch, export)
    if arch == "llama_builder":
        blobs = d / "blobs"
        blobs.mkdir()
        (export / "model.onnx.data").rename(blobs / "0f3a")
        (export / "model.onnx.data").symlink_to(blobs / "0f3a")
    return export / "model.onnx"


@pytest.fixture(scope="module", params=EXPORTERS)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    arch = request.param
    d = tmp_path_factory.mktemp(arch)
    model = _lay_out(arch, d)
    recipe = {"name": arch, "targets": SOCS,
              "llm": {"model": str(model), "sequence_lengths": [16, 1], "context_lengths": [64], "parts": 2,
                      "precision": "w8a16", "prompts": {"dir": str(model.parent / "prompts"), "samples": 2, "verify": 2},
                      "generate": GENERATE, "tokenizer": [str(model.parent / "tokenizer.json"),
                                                          str(model.parent / "tokenizer_config.json")]}}
    (d / f"{arch}.yaml").write_text(json.dumps(recipe))
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(d / "cache")}
    env.pop("MAKEFLAGS", None)
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(d / f"{arch}.yaml"), "-o", str(d / "out")],
                       capture_output=True, text=True, env=env, cwd=d, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    return arch, d


def test_exports_build_unedited_on_two_socs(built: tuple[str, Path]) -> None:
    arch, d = built
    for soc in SOCS:
        out = d / "out" / soc / arch
        assert sorted(p.name for p in out.glob("*_qnn.bin")) == [f"{arch}_1_of_2_qnn.bin", f"{arch}_2_of_2_qnn.bin"]
        verify = json.loads((out / "llm_verify.json").read_text())["by_cl"]["64"]["simulator"]
        assert verify["token_agreement"] >= 0.75 and verify["cosine_mean"] >= 0.95, verify


def test_shipped_config_carries_the_exports_own_ids(built: tuple[str, Path]) -> None:
    """bos/eos/pad, vocabulary and decoding options are the export's own (BOS is id 0 here: a pad id of 0 would
    mask it): the builder's genai_config.json; optimum writes none, so config.json / generation_config.json, the
    pad from tokenizer_config.json's `pad_token` (Qwen2's tokenizer names one), else the EOS (what transformers
    pads with when a model names no pad: the Llama export)."""
    arch, d = built
    if arch.endswith("_builder"):
        export = json.loads((EXPORTS / arch / "genai_config.json").read_text())
    else:
        hf = {**json.loads((EXPORTS / arch / "config.json").read_text()),
              **json.loads((EXPORTS / arch / "generation_config.json").read_text())}
        tok = json.loads((EXPORTS / arch / "tokenizer_config.json").read_text())
        named = [int(i) for i, t in tok.get("added_tokens_decoder", {}).items() if t["content"] == tok.get("pad_token")]
        assert "pad_token_id" not in hf and len(named) == (arch == "qwen2_optimum")
        export = {"model": {**{k: hf[k] for k in ("bos_token_id", "eos_token_id", "vocab_size")},
                            "pad_token_id": named[0] if named else hf["eos_token_id"]}, "search": {}}
    for soc in SOCS:
        shipped = json.loads((d / "out" / soc / arch / "genai_config.json").read_text())
        for key in ("bos_token_id", "eos_token_id", "pad_token_id", "vocab_size"):
            assert shipped["model"][key] == export["model"][key], key
        assert shipped["model"]["decoder"]["sliding_window"]["pad_value"] == export["model"]["pad_token_id"]
        assert shipped["search"].get("top_k") == export["search"].get("top_k")
        assert shipped["search"]["max_length"] == 64  # the static graphs' cache, not the export's 128
    assert export["model"]["bos_token_id"] == 0 != export["model"]["pad_token_id"] or arch.startswith("qwen2")


def _twin(d: Path, arch: str, dst: Path) -> tuple[Path, int]:
    from ctxbuild.llm import genai_config
    from ctxbuild.llm.layout import Layout

    work = d / "out" / ".ctxbuild" / "work" / "llm"
    split = next(p for p in work.glob(f"{arch}-*") if "-q" not in p.name)
    layout = Layout.read(split / "layout.json")
    cl = max(g.cl for g in layout.graphs)
    parts = {(g.part, g.ar): split / f"{g.name}.onnx" for g in layout.graphs if g.cl == cl}
    return genai_config.cpu_twin(layout, cl, parts, dst), cl


def _genai_tokens(model: object, prompt: np.ndarray, cl: int) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=cl)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt.astype(np.int32))
    start = len(gen.get_sequence(0))  # genai's sequence holds the prompt padded to whole windows
    while not gen.is_done() and len(gen.get_sequence(0)) < start + GENERATE:
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[start:]]


def test_genai_runs_the_shipped_config_and_gives_the_exports_tokens(built: tuple[str, Path], tmp_path: Path) -> None:
    """The shipped config's pipeline on the float static graphs (CPU EP), run by onnxruntime-genai: its greedy
    tokens are the original export's (onnxruntime on the builder's model.onnx), for a prompt inside one prompt
    window and one of three windows."""
    from ctxbuild.llm import pipeline

    arch, d = built
    twin_dir, cl = _twin(d, arch, tmp_path)
    shipped = json.loads((d / "out" / SOCS[0] / arch / "genai_config.json").read_text())
    twin = json.loads((twin_dir / "genai_config.json").read_text())
    assert {k: v for k, v in twin["model"].items() if k != "decoder"} == \
        {k: v for k, v in shipped["model"].items() if k != "decoder"}
    assert twin["search"] == shipped["search"]
    model = og.Model(str(twin_dir))
    prompts = [np.load(f) for f in sorted((EXPORTS / arch / "prompts").glob("*.npy"))]
    assert min(len(p) for p in prompts) < 16 < 2 * 16 < max(len(p) for p in prompts)
    eos = shipped["model"]["eos_token_id"]
    seen = set()
    for prompt in prompts:
        want = pipeline.reference_generate(EXPORTS / arch / "model.onnx", prompt, GENERATE).tokens
        stop = next((i + 1 for i, t in enumerate(want) if t in (eos if isinstance(eos, list) else [eos])), GENERATE)
        assert _genai_tokens(model, prompt, cl) == want[:stop]
        seen.update(want)
    assert len(seen) > 2  # random weights: a continuation may repeat one token, not every one


def test_optimum_static_graphs_are_constant_shaped_and_decode_as_the_export(built: tuple[str, Path]) -> None:
    """torch.onnx's per-layer masks, run-time rotary (Sin/Cos) and shape arithmetic are gone from the static
    graphs (rotary is a Gather from a table by position_ids), and the float graphs chained on the CPU decode the
    export's own greedy tokens, logits within 1e-4."""
    import onnx

    from ctxbuild.llm import pipeline
    from ctxbuild.llm.layout import Layout

    arch, d = built
    if not arch.endswith("_optimum"):
        pytest.skip("the builder's exports are checked by the tests above")
    split = next(p for p in (d / "out" / ".ctxbuild" / "work" / "llm").glob(f"{arch}-*") if "-q" not in p.name)
    layout = Layout.read(split / "layout.json")
    for g in layout.graphs:
        ops = {n.op_type for n in onnx.load(str(split / f"{g.name}.onnx"), load_external_data=False).graph.node}
        assert not ops & {"Shape", "Sin", "Cos", "Range", "ConstantOfShape", "IsNaN", "Where", "Equal", "Cast",
                          "Identity", "Constant"}, (g.name, ops)
    run = pipeline.cpu_runner({(g.part, g.ar, g.cl): split / f"{g.name}.onnx" for g in layout.graphs})
    ranges, kv = layout.parts, (layout.kv_heads, layout.head_dim)
    for f in sorted((EXPORTS / arch / "prompts").glob("*.npy")):
        prompt = np.load(f)
        want = pipeline.reference_generate(EXPORTS / arch / "model.onnx", prompt, GENERATE)
        got = pipeline.generate(run, ranges, kv, prompt, GENERATE, 64, 16)
        assert got.tokens == want.tokens
        assert max(float(np.abs(a - b).max()) for a, b in zip(got.logits, want.logits)) < 1e-4


def test_a_pad_id_of_zero_changes_the_tokens(built: tuple[str, Path], tmp_path: Path) -> None:
    """What the config's ids protect: with the old default pad 0 (= the Llama export's BOS), genai masks the BOS
    and decodes other tokens, so the check above is not vacuous."""
    from ctxbuild.llm import pipeline

    arch, d = built
    if arch != "llama_builder":
        pytest.skip("shown once, on the Llama builder export (Qwen2's pad id is 0 itself, its prompts carry no BOS)")
    twin_dir, cl = _twin(d, arch, tmp_path)
    config = json.loads((twin_dir / "genai_config.json").read_text())
    config["model"]["pad_token_id"] = config["model"]["decoder"]["sliding_window"]["pad_value"] = 0
    (twin_dir / "genai_config.json").write_text(json.dumps(config))
    model = og.Model(str(twin_dir))
    prompt = np.load(sorted((EXPORTS / "llama_builder" / "prompts").glob("*.npy"))[-1])
    assert prompt[0] == 0
    assert _genai_tokens(model, prompt, cl) != pipeline.reference_generate(EXPORTS / arch / "model.onnx", prompt,
                                                                          GENERATE).tokens


def test_a_symbolic_dim_with_no_config_beside_the_model_is_refused(tmp_path: Path) -> None:
    """The builder's export without the files it wrote beside it: exit 2, one line naming the recipe line, the
    open dim and what to do."""
    export = tmp_path / "export"
    export.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(EXPORTS / "qwen2_builder" / name, export / name)
    shutil.copytree(EXPORTS / "qwen2_builder" / "prompts", export / "prompts")
    (tmp_path / "q.yaml").write_text(json.dumps({"name": "q", "targets": ["SM8650"], "llm": {
        "model": "export/model.onnx", "sequence_lengths": [16, 1], "context_lengths": [64],
        "prompts": {"dir": "export/prompts"}}}))
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", "q.yaml", "-o", "out"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{tmp_path / 'q.yaml'}:1: model.onnx: head_dim ('kv_cache_dim')" in lines[0]
    assert "keep the exporter's genai_config.json or config.json beside the model" in lines[0]


def test_an_attention_whose_mask_cannot_be_told_is_refused(tmp_path: Path) -> None:
    """An optimum export whose first attention adds its scores to themselves (no operand from attention_mask
    alone): exit 2 at plan time, one line naming the recipe, the Softmax and what to do."""
    import onnx

    export = tmp_path / "export"
    shutil.copytree(EXPORTS / "llama_optimum", export)
    m = onnx.load(str(export / "model.onnx"))
    add = next(n for n in m.graph.node if n.name == "/model/layers.0/self_attn/Add_2")
    add.input[1] = add.input[0]
    onnx.save(m, str(export / "model.onnx"))
    (tmp_path / "q.yaml").write_text(json.dumps({"name": "q", "targets": ["SM8650"], "llm": {
        "model": "export/model.onnx", "sequence_lengths": [16, 1], "context_lengths": [64],
        "prompts": {"dir": "export/prompts"}}}))
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", "q.yaml", "-o", "out"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{tmp_path / 'q.yaml'}:1: model.onnx: attention Softmax " \
        "'/model/layers.0/self_attn/Softmax': cannot tell its mask from its scores" in lines[0], lines
    assert "export with optimum-cli" in lines[0]
