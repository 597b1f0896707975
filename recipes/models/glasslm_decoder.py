"""A *trained* decoder for the `llm:` recipes: glassllm's English model (PyPI package `glassllm`, MIT; a 4-layer
Llama-architecture decoder: RMSNorm, RoPE, grouped-query attention 4/2 heads, SwiGLU, tied embedding; hidden 128,
vocabulary 1024, trained to 128 positions, validation loss 4.19) exported in the optimum convention by
llm_decoder.py's writer, with real English prompts tokenized by the package's own tokenizer.

glassllm rotates adjacent coordinate pairs (interleaved RoPE); the exporter (like HF's Llama) rotates the two halves
of each head. The Q and K projections' output columns are permuted per head (evens, then odds): the dot products of
queries and keys are unchanged, so the export computes the same logits (tests/e2e/test_llm.py checks it against
glassllm's own forward).

Usage: python recipes/models/glasslm_decoder.py DEST   (needs `pip install --no-deps glassllm==0.1.0`)
"""
from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).parent))
import llm_decoder  # noqa: E402 - the writer beside this script

# Prompts in the style of the training text (Alice's Adventures in Wonderland), written here, not taken from it.
PROMPTS = [
    "Alice was beginning to get very tired of sitting by her sister on the bank, and",
    "The Queen turned crimson with fury, and, after glaring at her for a moment",
    "“I wonder what they will say to me,” thought Alice, as she walked down the",
    "The Rabbit took a watch out of its pocket, looked at it, and then hurried",
    "There was a table set out under a tree in front of the house, and the",
    "“Would you tell me, please, which way I ought to go from here?” said",
]


def _weights() -> tuple[llm_decoder.Config, dict[str, np.ndarray]]:
    root = resources.files("glassllm") / "weights"
    with resources.as_file(root / "en.npz") as path, np.load(path) as z:
        raw = {k: z[k] for k in z.files}
    c = json.loads(str(raw.pop("__config__")))
    cfg = llm_decoder.Config(vocab=c["vocab_size"], hidden=c["d_model"], layers=c["n_layers"], heads=c["n_heads"],
                             kv_heads=c["n_kv_heads"], intermediate=raw["blocks.0.ffn.W1"].shape[1],
                             max_positions=c["max_len"], rope_theta=c["rope_base"], eps=c["eps"])
    hd = cfg.head_dim
    halves = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])  # interleaved pairs -> rotate-half layout

    def per_head(w: np.ndarray) -> np.ndarray:
        cols = np.concatenate([h * hd + halves for h in range(w.shape[1] // hd)])
        return w[:, cols]

    w = {"model.embed_tokens.weight": raw["E"], "/model/norm.weight": raw["norm_f.gamma"]}
    for i in range(cfg.layers):
        b, m = f"blocks.{i}", f"model.layers.{i}"
        w.update({f"/model/layers.{i}/input_layernorm.weight": raw[f"{b}.norm1.gamma"],
                  f"/model/layers.{i}/post_attention_layernorm.weight": raw[f"{b}.norm2.gamma"],
                  f"{m}.self_attn.q_proj.weight": per_head(raw[f"{b}.attn.W_Q"]),
                  f"{m}.self_attn.k_proj.weight": per_head(raw[f"{b}.attn.W_K"]),
                  f"{m}.self_attn.v_proj.weight": raw[f"{b}.attn.W_V"],
                  f"{m}.self_attn.o_proj.weight": raw[f"{b}.attn.W_O"],
                  f"{m}.mlp.gate_proj.weight": raw[f"{b}.ffn.W1"], f"{m}.mlp.up_proj.weight": raw[f"{b}.ffn.W3"],
                  f"{m}.mlp.down_proj.weight": raw[f"{b}.ffn.W2"]})
    return cfg, w


def tokenize(text: str) -> np.ndarray:
    from glassllm.tokenizer import Tokenizer

    with resources.as_file(resources.files("glassllm") / "weights" / "en.tokenizer.json") as path:
        return np.asarray(Tokenizer.load(path).encode(text), dtype=np.int64)


def main(dest: Path) -> None:
    cfg, weights = _weights()
    dest.mkdir(parents=True, exist_ok=True)
    onnx.save(llm_decoder.decoder(cfg, weights=weights), dest / "glasslm.onnx")
    d = dest / "prompts" / "glasslm"
    d.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(PROMPTS):
        np.save(d / f"prompt_{i:03d}.npy", tokenize(text))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
