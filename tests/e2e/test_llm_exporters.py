"""Decoders as the real exporters write them (tests/exports/: onnxruntime-genai 0.18.0's model builder and
optimum-onnx 0.1.0's `optimum-cli export onnx --task text-generation-with-past` (torch.onnx) run on tiny Llama,
Qwen2, Phi-3 and Gemma checkpoints, committed as written) built unedited by an `llm:` recipe on two SoCs; the build runs the
genai_config.json it ships with onnxruntime-genai on its CPU twin against the original export's tokens
(actions/llm_genai.py), writes that twin out, and fails on a config with a wrong special-token id.

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
import onnxruntime_genai as og
import pytest

from tests.conftest import llm_logits, llm_part_checks

pytestmark = pytest.mark.e2e

EXPORTS = Path(__file__).parents[1] / "exports"
EXPORTERS = ("llama_builder", "qwen2_builder", "llama_optimum", "qwen2_optimum",  # tests/exports/<arch>_<exporter>
             "phi3_builder", "gemma_builder", "phi3_optimum", "gemma_optimum")
SOCS = ["SM8650", "SM8750"]
# Phi-3 and Gemma differ from Llama before the compile (their graphs and ids): one SoC each, the two SoCs between
# them, to keep the file's CI time
ONE_SOC = {"phi3_builder": ["SM8750"], "phi3_optimum": ["SM8750"], "gemma_builder": ["SM8650"], "gemma_optimum": ["SM8650"]}
# the ids each checkpoint was made with (bos, eos, pad): Gemma's are its own, not Llama's
OWN_IDS = {"phi3": (0, 1, 1), "gemma": (2, 1, 0)}
GENERATE = 8  # tokens the optimum graphs' own check decodes
WINDOW, CL = 16, 64


def _socs(arch: str) -> list[str]:
    return ONE_SOC.get(arch, SOCS)


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


def _build(arch: str, model: Path, d: Path, socs: list[str]) -> subprocess.CompletedProcess[str]:
    """The recipe a user writes beside the export (llm.generate unset: genai's check compares 32 tokens)."""
    recipe = {"name": arch, "targets": socs,
              "llm": {"model": str(model), "sequence_lengths": [WINDOW, 1], "context_lengths": [CL], "parts": 2,
                      "precision": "w8a16", "prompts": {"dir": str(model.parent / "prompts"), "samples": 2, "verify": 2},
                      "tokenizer": [str(model.parent / "tokenizer.json"), str(model.parent / "tokenizer_config.json")],
                      # random weights: near-flat logits make greedy agreement fragile (measured 0.73-1.00 at w8a16,
                      # perplexity ratio 0.91-1.03x); the default 0.8 is a trained decoder's bar
                      "min_agreement": 0.7}}
    (d / f"{arch}.yaml").write_text(json.dumps(recipe))
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(d / "cache")}
    env.pop("MAKEFLAGS", None)
    return subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(d / f"{arch}.yaml"), "-o", str(d / "out")],
                          capture_output=True, text=True, env=env, cwd=d, timeout=900)


@pytest.fixture(scope="module", params=EXPORTERS)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    arch = request.param
    d = tmp_path_factory.mktemp(arch)
    p = _build(arch, _lay_out(arch, d), d, _socs(arch))
    assert p.returncode == 0, p.stdout + p.stderr
    (d / "console.txt").write_text(p.stdout)
    return arch, d


def test_exports_build_unedited_on_two_socs(built: tuple[str, Path]) -> None:
    arch, d = built
    for soc in _socs(arch):
        out = d / "out" / soc / arch
        assert sorted(p.name for p in out.glob("*_qnn.bin")) == [f"{arch}_1_of_2_qnn.bin", f"{arch}_2_of_2_qnn.bin"]
        # passed: top-1 agreement with the float tokens >= 0.75 pooled over each CL's calls (a graph has 2 or 4)
        assert all(r["passed"] for r in llm_part_checks(out).values())
        for logits in llm_logits(out):  # the last part's twins on the recorded calls, against the float part
            assert logits["cosine"] >= 0.95, logits


def test_shipped_config_carries_the_exports_own_ids(built: tuple[str, Path]) -> None:
    """bos/eos/pad, vocabulary and decoding options are the export's own (BOS is id 0 but for Gemma: a pad id of 0
    would mask it): the builder's genai_config.json; optimum writes none, so config.json / generation_config.json
    (Phi-3's and Gemma's name a pad), else the pad from tokenizer_config.json's `pad_token` (Qwen2's tokenizer names
    one), else the EOS (what transformers pads with when a model names no pad: the Llama export)."""
    arch, d = built
    if arch.endswith("_builder"):
        export = json.loads((EXPORTS / arch / "genai_config.json").read_text())
    else:
        hf = {**json.loads((EXPORTS / arch / "config.json").read_text()),
              **json.loads((EXPORTS / arch / "generation_config.json").read_text())}
        tok = json.loads((EXPORTS / arch / "tokenizer_config.json").read_text())
        named = [int(i) for i, t in tok.get("added_tokens_decoder", {}).items() if t["content"] == tok.get("pad_token")]
        assert ("pad_token_id" in hf) == arch.startswith(("phi3", "gemma")) and len(named) == (arch == "qwen2_optimum")
        export = {"model": {**{k: hf[k] for k in ("bos_token_id", "eos_token_id", "vocab_size")},
                            "pad_token_id": hf.get("pad_token_id", named[0] if named else hf["eos_token_id"])},
                  "search": {}}
    for soc in _socs(arch):
        shipped = json.loads((d / "out" / soc / arch / "genai_config.json").read_text())
        for key in ("bos_token_id", "eos_token_id", "pad_token_id", "vocab_size"):
            assert shipped["model"][key] == export["model"][key], key
        assert shipped["model"]["decoder"]["sliding_window"]["pad_value"] == export["model"]["pad_token_id"]
        assert shipped["search"].get("top_k") == export["search"].get("top_k")
        assert shipped["search"]["max_length"] == 64  # the static graphs' cache, not the export's 128
        if arch.split("_")[0] in OWN_IDS:
            assert tuple(shipped["model"][f"{k}_token_id"] for k in ("bos", "eos", "pad")) == OWN_IDS[arch.split("_")[0]]
    assert export["model"]["bos_token_id"] != export["model"]["pad_token_id"] or arch.startswith("qwen2")


def _genai_tokens(model: object, prompt: np.ndarray, n: int) -> list[int]:
    gen = og.Generator(model, og.GeneratorParams(model))
    gen.append_tokens(prompt.astype(np.int32))
    start = len(gen.get_sequence(0))  # genai's sequence holds the prompt padded to whole windows
    while not gen.is_done() and len(gen.get_sequence(0)) < start + n:
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[start:]]


def _prompts(arch: str) -> list[np.ndarray]:
    prompts = [np.load(f) for f in sorted((EXPORTS / arch / "prompts").glob("*.npy"))]
    assert min(len(p) for p in prompts) < WINDOW < 2 * WINDOW < max(len(p) for p in prompts)  # 1 and 3 windows
    return prompts


def test_the_build_runs_the_shipped_config_through_genai(built: tuple[str, Path]) -> None:
    """The build's llm_genai check: onnxruntime-genai, the shipped config on its float CPU twin, gives the original
    export's first 32 greedy tokens (up to an EOS) for the one-window prompt and as many as CL 64 leaves after the
    three-window one (16); the summary has its row per SoC."""
    from ctxbuild.llm import pipeline

    arch, d = built
    shipped = json.loads((d / "out" / _socs(arch)[0] / arch / "genai_config.json").read_text())["model"]
    eos = shipped["eos_token_id"] if isinstance(shipped["eos_token_id"], list) else [shipped["eos_token_id"]]
    # what the check compares against, decoded here independently: the original export's own greedy tokens
    want = [pipeline.reference_generate(EXPORTS / arch / "model.onnx", prompt, 32).tokens for prompt in _prompts(arch)]
    want = [w[:next((i + 1 for i, t in enumerate(w) if t in eos), 32)] for w in want]
    rooms = [CL - -(-len(prompt) // WINDOW) * WINDOW for prompt in _prompts(arch)]  # after whole windows
    assert rooms == [48, 16] and len({t for w in want for t in w}) > 2  # random weights: not one repeated token
    for soc in _socs(arch):
        result = json.loads((d / "out" / soc / arch / "genai_verify.json").read_text())
        assert result["passed"] and result["first_difference"] is None, result
        assert result["tokens_per_prompt"] == 32
        assert result["tokens_compared"] == [min(len(w), r) for w, r in zip(want, rooms)] and \
            result["tokens_compared"][1] > 0, result
        assert result["ids"] == {k: shipped[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        assert any(line.split()[1:3] == ["genai_config.json", soc] and line.endswith(" ok")
                   for line in (d / "console.txt").read_text().splitlines() if line.startswith("  ")), soc


def test_the_cpu_twin_is_written_and_runs_on_a_pc(built: tuple[str, Path]) -> None:
    """OUT/<SoC>/<recipe>/cpu_twin/: the shipped config with the QDQ part graphs (what was compiled) in place of the
    wrappers, the helper stages and the tokenizer; onnxruntime-genai opens it and decodes what the build recorded."""
    import onnx

    arch, d = built
    out = d / "out" / _socs(arch)[0] / arch
    twin = out / "cpu_twin"
    config = json.loads((twin / "genai_config.json").read_text())
    shipped = json.loads((out / "genai_config.json").read_text())
    assert {k: v for k, v in config["model"].items() if k != "decoder"} == \
        {k: v for k, v in shipped["model"].items() if k != "decoder"} and config["search"] == shipped["search"]
    parts = [s["filename"] for st in config["model"]["decoder"]["pipeline"] for s in st.values()
             if s["filename"].endswith("_of_2.onnx") and not s["filename"].startswith(("kv_", "mask_"))]
    assert len(parts) == 4 and not any("session_options" in s for st in config["model"]["decoder"]["pipeline"]
                                       for s in st.values())
    assert all(any(n.op_type == "DequantizeLinear" for n in onnx.load(twin / f, load_external_data=False).graph.node)
               for f in parts)
    model = og.Model(str(twin))
    assert og.Tokenizer(model).encode("hello world").size > 0  # the export's tokenizer files came along
    recorded = json.loads((out / "genai_verify.json").read_text())["cpu_twin"]
    assert recorded["graphs"] == "qdq"
    assert _genai_tokens(model, _prompts(arch)[0], 32) == recorded["tokens"]


@pytest.mark.parametrize("built", [a for a in EXPORTERS if a.endswith("_optimum")], indirect=True)
def test_optimum_static_graphs_are_constant_shaped_and_decode_as_the_export(built: tuple[str, Path]) -> None:
    """torch.onnx's per-layer masks, run-time rotary (Sin/Cos) and shape arithmetic are gone from the static
    graphs (rotary is a Gather from a table by position_ids; Gemma's export computes its positions from the past
    length: the static graphs take them as position_ids), and the float graphs chained on the CPU decode the
    export's own greedy tokens, logits within 1e-4."""
    import onnx

    from ctxbuild.llm import pipeline
    from ctxbuild.llm.layout import Layout

    arch, d = built
    split = next(p for p in (d / "out" / ".ctxbuild" / "work" / "llm").glob(f"{arch}-*") if "-q" not in p.name)
    layout = Layout.read(split / "layout.json")
    for g in layout.graphs:
        graph = onnx.load(str(split / f"{g.name}.onnx"), load_external_data=False).graph
        ops = {n.op_type for n in graph.node}
        assert "position_ids" in {i.name for i in graph.input}  # every part: its layers' rotary
        assert not ops & {"Shape", "Sin", "Cos", "Range", "ConstantOfShape", "IsNaN", "Equal", "Cast",
                          "Identity", "Constant"}, (g.name, ops)
        # the only Wheres: the mask, each attention's (llm/mask.py)
        assert {n.input[0] for n in graph.node if n.op_type == "Where"} == {"attention_mask/lowered_masked"}
    run = pipeline.cpu_runner({(g.part, g.ar, g.cl): split / f"{g.name}.onnx" for g in layout.graphs})
    ranges, kv = layout.parts, (layout.kv_heads, layout.head_dim)
    for f in sorted((EXPORTS / arch / "prompts").glob("*.npy")):
        prompt = np.load(f)
        want = pipeline.reference_generate(EXPORTS / arch / "model.onnx", prompt, GENERATE)
        got = pipeline.generate(run, ranges, kv, prompt, GENERATE, 64, 16)
        assert got.tokens == want.tokens
        assert max(float(np.abs(a - b).max()) for a, b in zip(got.logits, want.logits)) < 1e-4


# once, on the Llama builder export (Qwen2's pad id is 0 itself, its prompts carry no BOS)
@pytest.mark.parametrize("built", ["llama_builder"], indirect=True)
def test_a_wrong_special_token_id_fails_the_build(built: tuple[str, Path], tmp_path: Path) -> None:
    """The export's own genai_config.json says pad = BOS (id 0, what the old default wrote): genai pads the prompt
    with it and masks the BOS, so the shipped config decodes other tokens. The build fails (exit 1) naming the
    prompt, the position and both ids, the config is set aside, the summary's row says FAILED."""
    arch, d = built
    model = _lay_out(arch, tmp_path)
    config = json.loads((model.parent / "genai_config.json").read_text())
    assert config["model"]["bos_token_id"] == 0 != config["model"]["pad_token_id"]
    config["model"]["pad_token_id"] = 0
    (model.parent / "genai_config.json").write_text(json.dumps(config))
    shutil.copytree(d / "cache", tmp_path / "cache")  # the bundles and twins restore; the ids re-run the split
    p = _build(arch, model, tmp_path, SOCS[:1])
    assert p.returncode == 1, p.stdout + p.stderr
    line = next(x for x in p.stderr.splitlines() if x.startswith(f"ctxbuild: FAILED llm_genai/{arch}@{SOCS[0]}"))
    assert "(bos/eos/pad ids 0/1/0) decodes prompt 0 differently from the original export from token 0 on (genai id" in line
    record = json.loads(next((tmp_path / "out" / ".ctxbuild" / "records").glob("llm_genai*.json")).read_text())
    assert record["status"] == "failed" and record["result"]["first_difference"]["position"] == 0
    diff = record["result"]["first_difference"]
    assert f"(genai id {diff['genai']}, the export's {diff['original']})" in line and diff["genai"] != diff["original"]
    out = tmp_path / "out" / SOCS[0] / arch
    assert not (out / "genai_config.json").exists() and not (out / "cpu_twin" / "genai_config.json").exists()
    assert (tmp_path / "out" / ".ctxbuild" / "failed" / SOCS[0] / arch / "genai_config.json").is_file()
    assert any(line.split()[1:3] == ["genai_config.json", SOCS[0]] and "FAILED" in line for line in p.stdout.splitlines())
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert not any(a["path"].endswith("genai_config.json") for a in manifest["artifacts"])


def test_a_symbolic_dim_with_no_config_beside_the_model_is_refused(tmp_path: Path) -> None:
    """The builder's export without the files it wrote beside it: exit 2, one line naming the recipe line, the
    open dim and what to do."""
    export = tmp_path / "export"
    export.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(EXPORTS / "qwen2_builder" / name, export / name)
    shutil.copytree(EXPORTS / "qwen2_builder" / "prompts", export / "prompts")
    line = _refusal(tmp_path)
    assert f"{tmp_path / 'q.yaml'}:1: model.onnx: head_dim ('kv_cache_dim')" in line
    assert "keep the exporter's genai_config.json or config.json beside the model" in line


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
    line = _refusal(tmp_path)
    assert f"{tmp_path / 'q.yaml'}:1: model.onnx: attention Softmax " \
        "'/model/layers.0/self_attn/Softmax': cannot tell its mask from its scores" in line, line
    assert "export with optimum-cli" in line


def test_positions_computed_from_no_past_length_are_refused(tmp_path: Path) -> None:
    """Gemma's optimum export takes no position_ids: the static graphs take as position_ids what it computes from
    the past length (transformers' cache_position, the Range the rotary reads). With that Range starting at 0
    instead, no positions can be taken: exit 2 at plan time, one line naming the recipe and what to do."""
    import onnx
    from onnx import numpy_helper

    export = tmp_path / "export"
    shutil.copytree(EXPORTS / "gemma_optimum", export)
    m = onnx.load(str(export / "model.onnx"))
    positions = next(n for n in m.graph.node if n.name == "/model/Range")
    delta = next(n for n in m.graph.node if n.output[0] == positions.input[2]).attribute[0].t
    m.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(delta) * 0, "start_0"))
    positions.input[0] = "start_0"
    onnx.save(m, str(export / "model.onnx"))
    line = _refusal(tmp_path)
    assert f"{tmp_path / 'q.yaml'}:1: model.onnx: no position_ids input, and 0 Range(s) from the past length feed " \
        "the rotary" in line, line
    assert "export with position_ids as an input" in line


def _refusal(tmp_path: Path) -> str:
    """Build a recipe over tmp_path/export/model.onnx: it must be refused at plan time, exit 2, in one line."""
    (tmp_path / "q.yaml").write_text(json.dumps({"name": "q", "targets": ["SM8650"], "llm": {
        "model": "export/model.onnx", "sequence_lengths": [16, 1], "context_lengths": [64],
        "prompts": {"dir": "export/prompts"}}}))
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", "q.yaml", "-o", "out"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]
