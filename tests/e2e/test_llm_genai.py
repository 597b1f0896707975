"""onnxruntime-genai (0.18.0, a dependency) against the genai_config.json an `llm:` build writes.

genai parses the config the build writes; its Linux x86 wheel has no QNN EP, so the proof runs the config's CPU
twin (ctxbuild.llm.genai_config.write_twin: the shipped config with the float static graphs or the QDQ parts in
place of the compiled wrappers) and compares genai's greedy tokens with the original model's and ctxbuild's own
decoder's. The build runs the float one itself (actions/llm_genai.py, tests/e2e/test_llm_exporters.py); this module
builds without verification and checks the runtime directly, at prompt lengths around the window.
"""
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

from tests.conftest import RECIPES

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's model and prompts, one CL, built without verification (the runtime is what is tested)."""
    d = tmp_path_factory.mktemp("genai")
    subprocess.run([sys.executable, str(RECIPES / "models" / "make_models.py"), str(d / "models")], check=True)
    recipe = {"name": "llama", "targets": ["SM8650"],
              "llm": {"model": str(d / "models" / "llama_tiny.onnx"), "sequence_lengths": [16, 1], "context_lengths": [64],
                      "parts": 2, "precision": "w8a16",
                      "prompts": {"dir": str(d / "models" / "prompts" / "llama_tiny"), "samples": 2, "verify": 2},
                      "generate": 8}}
    (d / "llama.yaml").write_text(json.dumps(recipe))
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(d / "cache")}
    env.pop("MAKEFLAGS", None)
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(d / "llama.yaml"), "-o", str(d / "out"),
                        "--no-verify"], capture_output=True, text=True, env=env, cwd=d, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def test_genai_parses_the_generated_config(built: Path, tmp_path: Path) -> None:
    """og.Config refuses unknown or misspelled fields (checked with one): every field written is one genai 0.18.0 knows."""
    d = built / "out" / "SM8650" / "llama"
    config = og.Config(str(d))
    typo = json.loads((d / "genai_config.json").read_text())
    typo["model"]["decoder"]["sliding_window"]["slide_key_value_cach"] = False
    (tmp_path / "genai_config.json").write_text(json.dumps(typo))
    with pytest.raises(Exception, match="slide_key_value_cach"):
        og.Config(str(tmp_path))
    with pytest.raises(Exception, match="QNN execution provider is not supported"):  # the x86 Linux wheel
        og.Model(config)


def _twin(built: Path, qdq: bool, dst: Path, session_options: dict[str, str] | None = None) -> tuple[Path, int]:
    """The shipped config's CPU twin with, at the largest CL, each part's float static graph or QDQ graph."""
    from ctxbuild.llm import genai_config
    from ctxbuild.llm.layout import Layout

    work = built / "out" / ".ctxbuild" / "work" / "llm"
    split = next(d for d in work.glob("llama-*") if "-q" not in d.name)
    layout = Layout.read(split / "layout.json")
    cl = max(g.cl for g in layout.graphs)
    graphs = {f"{g.name}_ctx.onnx": (next(work.glob(f"llama-q{g.part + 1}-*")) if qdq else split) / f"{g.name}.onnx"
              for g in layout.graphs if g.cl == cl}
    return genai_config.write_twin(built / "out" / "SM8650" / "llama" / "genai_config.json", graphs, dst,
                                   shutil.copyfile, session_options), cl


def _genai_tokens(model: object, prompt: np.ndarray, n: int, cl: int) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=cl)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt.astype(np.int32))
    for _ in range(n):
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[-n:]]


def _prompts(built: Path, length: int) -> list[np.ndarray]:
    return [np.load(f)[:length] for f in sorted((built / "models" / "prompts" / "llama_tiny").glob("*.npy"))[:2]]


# shorter than the prompt graph's AR (16), filling it, and the whole prompts (24: two windows)
@pytest.mark.parametrize("length", [11, 16, 24])
def test_genai_runs_the_config_on_the_float_parts_and_gives_the_original_tokens(built: Path, tmp_path: Path,
                                                                               length: int) -> None:
    """The device config's pipeline with the float static graphs in place of the wrappers (CPU EP, prepacking off
    as the build's check runs them): genai's greedy tokens are the ORIGINAL dynamic model's."""
    from ctxbuild.actions.llm_genai import SHARED
    from ctxbuild.llm import pipeline

    twin, cl = _twin(built, False, tmp_path, SHARED)
    model = og.Model(str(twin))
    device = json.loads((built / "out" / "SM8650" / "llama" / "genai_config.json").read_text())
    config = json.loads((twin / "genai_config.json").read_text())
    # the device config as shipped, but for the part stages' files and session options (EP)
    parts = [s for st in device["model"]["decoder"]["pipeline"] for s in st.values() if "session_options" in s]
    assert len(parts) == 4
    for s in parts:
        s["filename"] = s["filename"].replace("_ctx.onnx", ".onnx")
        s["session_options"] = SHARED
    assert config == device
    for prompt in _prompts(built, length):
        want = pipeline.reference_generate(built / "models" / "llama_tiny.onnx", prompt, 8).tokens
        assert _genai_tokens(model, prompt, 8, cl) == want
        assert len(set(want)) > 1


def test_genai_runs_the_qdq_parts_like_ctxbuilds_own_decoder(built: Path, tmp_path: Path) -> None:
    """The QDQ parts (what was compiled, same I/O as the wrappers) under genai decode the same greedy tokens as
    ctxbuild's verification decoder (pipeline.py) over the same graphs."""
    from ctxbuild.llm import pipeline
    from ctxbuild.llm.layout import Layout

    twin, cl = _twin(built, True, tmp_path)
    model = og.Model(str(twin))
    layout = Layout.read(next(p for p in (built / "out" / ".ctxbuild" / "work" / "llm").glob("llama-*/layout.json")))
    run = pipeline.cpu_runner({(g.part, g.ar, cl): twin / f"{g.name}.onnx" for g in layout.graphs if g.cl == cl})
    for prompt in _prompts(built, 24):
        ours = pipeline.generate(run, layout.parts, (layout.kv_heads, layout.head_dim), prompt, 8, cl, 16).tokens
        assert _genai_tokens(model, prompt, 8, cl) == ours


def test_genai_ending_at_the_originals_eos_is_no_difference(built: Path, tmp_path: Path) -> None:
    """A decode that reaches the EOS: genai ends there without keeping it (0.18.0), and the build's comparison
    counts that as the original's tokens, not as a difference at the EOS (which failed SmolLM2-135M's check)."""
    from ctxbuild.actions.llm_genai import SHARED, _decode, first_difference
    from ctxbuild.llm import pipeline

    twin, cl = _twin(built, False, tmp_path, SHARED)
    prompt = _prompts(built, 11)[0]
    want = pipeline.reference_generate(built / "models" / "llama_tiny.onnx", prompt, 8).tokens
    eos = want[3]  # the original emits it 4th: made the EOS, the decode ends there
    config = json.loads((twin / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = eos
    (twin / "genai_config.json").write_text(json.dumps(config))
    got = _decode(og, twin, [prompt], 8)
    assert got[0][0] == want[:want.index(eos)]  # ended before it, the EOS not in the sequence
    assert first_difference([want], got, {eos}) == ([want.index(eos)], None)
    other = next(t for t in range(384) if t not in want)  # an EOS the original never emits: genai runs on
    assert first_difference([want], got, {other})[1] == (0, len(got[0][0]), None, want[len(got[0][0])])
