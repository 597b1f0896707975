"""docs/llm.md's walkthrough, steps 4 to 7, as written, on what step 3 gives: onnxruntime-genai's model builder's
export of a tiny Llama checkpoint (tests/exports/llama_builder, every file the builder wrote), its prompts as text
files, the walkthrough's recipe block with the sizes a 4-layer random-weight model takes (AR 16, CL 64, 2 parts,
w8a16: w4a16 fails verification on random weights, as the walkthrough says), its build command, the files step 7
says to copy, and step 6's Python block on the CPU twin. Steps 1 to 3 need Hugging Face and torch, which tests do
not download."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
WALKTHROUGH = (ROOT / "docs" / "llm.md").read_text()
EXPORT = ROOT / "tests" / "exports" / "llama_builder"
PROMPTS = ["The recipe names the model and its targets.", "A build writes the binaries and the report."]
# what a tiny random-weight decoder takes instead of the walkthrough's 1B sizes
SMALL = {"sequence_lengths": [16, 1], "context_lengths": [64], "parts": 2, "precision": "w8a16"}


def _block(lang: str, starting: str) -> str:
    """The one code block of that language with a line starting so."""
    [body] = [b for lang_, b in re.findall(r"^```(\w*)\n(.*?)^```", WALKTHROUGH, re.S | re.M)
              if lang_ == lang and re.search(rf"^{re.escape(starting)}", b, re.M)]
    return body


def steps_4_and_5(d: Path, sizes: dict[str, object], timeout: float) -> tuple[dict, dict[str, str]]:
    """Step 4's recipe block with `sizes` as recipes/assistant.yaml in `d` (its prompts written by the caller), and
    step 5's build command run there as written (ctxbuild on PATH, a cache of its own): the recipe and the
    environment, for step 6."""
    recipe = yaml.safe_load(_block("yaml", "llm:"))
    recipe["llm"].update(sizes)
    (d / "recipes").mkdir()
    (d / "recipes" / "assistant.yaml").write_text(yaml.safe_dump(recipe))
    [build] = [line.split("#")[0].strip() for line in _block("", "ctxbuild build").splitlines()
               if line.startswith("ctxbuild build")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXBUILD_") and k != "MAKEFLAGS"}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", CTXBUILD_CACHE_DIR=str(d / "cache"))
    r = subprocess.run(["bash", "-ec", build], cwd=d, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return recipe, env


def test_walkthrough_steps_4_to_7(tmp_path: Path) -> None:
    export = tmp_path / "export"  # step 3's output directory, as the builder wrote it
    shutil.copytree(EXPORT, export, ignore=shutil.ignore_patterns("prompts"))
    (export / "prompts").mkdir()
    for i, text in enumerate(PROMPTS):  # step 4: `export/prompts/00.txt`, `01.txt`, ...
        (export / "prompts" / f"{i:02d}.txt").write_text(text + "\n")

    recipe, env = steps_4_and_5(tmp_path, SMALL, timeout=900)
    assert set(SMALL) <= set(recipe["llm"]) and recipe["llm"]["model"] == "../export/model.onnx"

    [soc] = recipe["targets"]
    shipped = tmp_path / "out" / soc / "assistant"  # step 7: what to copy to the device
    names = {p.name for p in shipped.iterdir()}
    assert {"genai_config.json", "tokenizer.json", "tokenizer_config.json", "genai_verify.json"} <= names
    assert len([n for n in names if n.endswith("_ctx.onnx")]) == 2 * 2  # 2 parts x AR {16, 1} x CL {64}
    assert len([n for n in names if n.endswith("_qnn.bin")]) == 2  # one per part
    assert [n for n in names if n.startswith("mask_")] and [n for n in names if n.startswith("kv_")]
    assert sorted(p.name for p in (shipped / "llm_verify").iterdir()) == ["part1_of_2.json", "part2_of_2.json"]

    code = _block("python", "model = og.Model").replace("out/SM8650/", f"out/{soc}/")  # step 6, on the CPU twin
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().startswith("Hello"), r.stdout  # the prompt, then what the model generated
