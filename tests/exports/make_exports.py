"""Make the exports tests/e2e/test_llm_exporters.py builds: tiny random-weight Hugging Face checkpoints (Llama and
Qwen2 architectures, each with its own small BPE tokenizer) run through onnxruntime-genai's model builder and
through optimum's ONNX exporter, as a user would. Run once, by hand (it needs torch and transformers, which CI does
not install); its outputs, a few hundred KB each, are committed beside it. README.md names the versions used.

    python tests/exports/make_exports.py builder [--arch A]      # writes tests/exports/<arch>_builder/
    python tests/exports/make_exports.py optimum --optimum-cli ENV/bin/optimum-cli   # <arch>_optimum/

optimum-onnx 0.1.0 needs transformers < 4.58, so its CLI lives in an environment of its own; the checkpoints are
made here (the same seed, so the same weights as the builder's) with the builder exports' committed tokenizers.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Text the tokenizers are trained on (any English prose does; this one is in the repository's own docs).
CORPUS = HERE.parents[1] / "docs" / "llm.md"
VOCAB = 384
ARCHS = {
    # BOS is id 0 in both (as in the issue): a runtime config that pads with id 0 masks the BOS.
    "llama": dict(special=["<s>", "</s>", "<unk>"], bos="<s>", eos="</s>", add_bos=True),
    "qwen2": dict(special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos="<|endoftext|>",
                  eos="<|im_end|>", add_bos=False),
    # Phi-3: fused qkv_proj and gate_up_proj; Llama's special tokens. Gemma: pad 0, eos 1, bos 2 (its own
    # tokenizer's order), tied embedding scaled by sqrt(hidden), GELU-tanh MLP, RMSNorm weights as (1 + w).
    "phi3": dict(special=["<s>", "</s>", "<unk>"], bos="<s>", eos="</s>", add_bos=True),
    # Gemma at the others' 0.1 init decodes one id at every step (its embedding scale): 0.2 gives varied tokens.
    "gemma": dict(special=["<pad>", "<eos>", "<bos>"], bos="<bos>", eos="<eos>", add_bos=True, init=0.2),
}
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)


def tokenizer(arch: str, out: Path) -> dict[str, int]:
    """Train a byte-level BPE on CORPUS and save it as a transformers fast tokenizer; the special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    spec = ARCHS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(CORPUS)], trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=spec["special"],
                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ids = {t: tok.token_to_id(t) for t in spec["special"]}
    if spec["add_bos"]:
        bos = spec["bos"]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, ids[bos])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=spec["bos"], eos_token=spec["eos"],
                                   unk_token=spec["special"][2] if arch in ("llama", "phi3") else None,
                                   pad_token="<pad>" if arch == "gemma" else None)
    fast.save_pretrained(out)
    return {"bos": ids[spec["bos"]], "eos": ids[spec["eos"]], "pad": ids[spec["special"][0]],
            "vocab": tok.get_vocab_size()}


def committed_tokenizer(arch: str, out: Path) -> dict[str, int]:
    """The builder export's tokenizer files (CORPUS has changed since: training again gives other merges)."""
    from tokenizers import Tokenizer

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(HERE / f"{arch}_builder" / name, out / name)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    spec = ARCHS[arch]
    return {"bos": tok.token_to_id(spec["bos"]), "eos": tok.token_to_id(spec["eos"]),
            "pad": tok.token_to_id(spec["special"][0]), "vocab": tok.get_vocab_size()}


def checkpoint(arch: str, out: Path, reuse_tokenizer: bool = False) -> None:
    import torch
    from transformers import (GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM, Phi3Config,
                              Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM)

    out.mkdir(parents=True, exist_ok=True)
    ids = committed_tokenizer(arch, out) if reuse_tokenizer else tokenizer(arch, out)
    torch.manual_seed(0)
    # Weights larger than the usual 0.02 init, so greedy decoding has clear winners (not float-noise ties).
    common = dict(SHAPE, vocab_size=ids["vocab"], bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                  initializer_range=ARCHS[arch].get("init", 0.1), torch_dtype="float32")
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False))
    elif arch == "phi3":
        model = Phi3ForCausalLM(Phi3Config(**common, tie_word_embeddings=False, pad_token_id=ids["eos"],
                                           original_max_position_embeddings=SHAPE["max_position_embeddings"]))
    elif arch == "gemma":
        model = GemmaForCausalLM(GemmaConfig(**common, head_dim=16, pad_token_id=ids["pad"],
                                             hidden_activation="gelu_pytorch_tanh"))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
        with torch.no_grad():  # Qwen2's Q/K/V biases start at zero, which the builder would drop: make them real
            for name, p in model.named_parameters():
                if name.endswith("_proj.bias"):
                    p.normal_(0.0, 0.1)
    model.eval().save_pretrained(out)


PROMPTS = [  # one shorter than the recipes' prompt window (AR 16), one longer (two windows)
    "The static graphs.",
    "Every build checks it: the float model decodes the prompts, and the parts on the CPU.",
]


def prompts(dst: Path) -> None:
    """The prompts as token ids (the export's own tokenizer.json, with its special tokens), `prompts/NN.npy`."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
    (dst / "prompts").mkdir(exist_ok=True)
    for i, text in enumerate(PROMPTS):
        np.save(dst / "prompts" / f"{i:02d}.npy", np.array(tok.encode(text).ids, np.int64))


def builder(archs: list[str]) -> None:
    for arch in archs:
        dst = HERE / f"{arch}_builder"
        with tempfile.TemporaryDirectory() as tmp:
            ckpt, built = Path(tmp) / "hf", Path(tmp) / "onnx"
            checkpoint(arch, ckpt)
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt),
                            "-o", str(built), "-p", "fp32", "-e", "cpu", "-c", str(Path(tmp) / "cache")],
                           check=True)
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir()
            for f in sorted(built.iterdir()):
                shutil.copy2(f, dst / f.name)
            for name in ("config.json", "generation_config.json"):  # what the builder read, for the record
                shutil.copy2(ckpt / name, dst / name)
        prompts(dst)
        print(dst, json.dumps(sorted(p.name for p in dst.iterdir())))


def optimum(cli: str, archs: list[str]) -> None:
    """`optimum-cli export onnx --task text-generation-with-past`, every file it writes kept as written. For Llama
    it writes no tokenizer files (transformers 4.57 cannot read the checkpoint's tokenizer_config.json, which
    transformers 5 wrote): the checkpoint's are copied beside the model, as a user keeps them."""
    for arch in archs:
        dst = HERE / f"{arch}_optimum"
        with tempfile.TemporaryDirectory() as tmp:
            ckpt, built = Path(tmp) / "hf", Path(tmp) / "onnx"
            checkpoint(arch, ckpt, reuse_tokenizer=True)
            subprocess.run([cli, "export", "onnx", "--model", str(ckpt), "--task", "text-generation-with-past",
                            str(built)], check=True)
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir()
            for f in sorted(built.iterdir()):
                shutil.copy2(f, dst / f.name)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                if not (dst / name).exists():
                    shutil.copy2(ckpt / name, dst / name)
        prompts(dst)
        print(dst, json.dumps(sorted(p.name for p in dst.iterdir())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exporter", choices=["builder", "optimum"])
    ap.add_argument("--optimum-cli", default="optimum-cli", help="optimum-cli of an environment with optimum-onnx")
    ap.add_argument("--arch", action="append", choices=sorted(ARCHS),
                    help="only these architectures (repeatable; default: all)")
    args = ap.parse_args()
    if args.exporter == "builder":
        builder(args.arch or list(ARCHS))
    else:
        optimum(args.optimum_cli, args.arch or list(ARCHS))


if __name__ == "__main__":
    main()
