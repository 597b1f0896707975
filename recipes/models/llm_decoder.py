"""Generate a tiny Llama-style decoder in the optimum / torch-export convention, plus calibration prompts.

The model is what `optimum-cli export onnx` hands over for a Llama/Qwen2 decoder: inputs `input_ids`,
`attention_mask` [batch, past+seq], `position_ids`, `past_key_values.N.key/value` [batch, kv_heads, past,
head_dim] with dynamic dims; outputs `logits`, `present.N.key/value`; plain ONNX ops (RMSNorm written out,
rotary embedding from cos/sin tables, grouped-query attention by repeating K/V heads, SiLU-gated MLP, LM head
tied to the embedding). Node names follow the exporter's `/model/layers.N/...` scopes, which ctxbuild's
static-graph pass uses to cut the model into parts.

Weights are random but scaled like a trained model's (std 1/sqrt(fan_in) projections, norm gains near 1,
embedding rows of norm ~4), seeded: running this twice writes byte-identical files.
With `lora_rank`, LoRA slots (PEFT names, `lora_B` zero) on q_proj/v_proj and adapters for them (`lora_adapter`).
No torch needed. Usage: python recipes/models/llm_decoder.py [DEST]   (default: this script's directory)
"""
from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 10
MASK_NEG = -100.0  # additive mask value: small enough for 16-bit activations to keep the scores' resolution
LORA_TARGETS = ("q_proj", "v_proj")  # PEFT's default target_modules for Llama


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    max_positions: int = 1024
    rope_theta: float = 10000.0
    eps: float = 1e-5
    lora_rank: int = 0  # > 0: PEFT-style LoRA slots on each layer's q_proj and v_proj (LORA_TARGETS)
    lora_alpha: float = 8.0  # PEFT's lora_alpha: the branch is scaled by alpha / rank (`lora_scaling`)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class _Builder:
    def __init__(self, rng: np.random.Generator, weights: dict[str, np.ndarray] | None = None,
                 data: BinaryIO | None = None, zeros: bool = False) -> None:
        self.rng, self.nodes, self.inits = rng, [], {}
        self.given = weights  # trained weights by name (recipes/models/glasslm_decoder.py); None: random ones
        self.data, self.zeros, self.offset = data, zeros, 0  # external data written as the weights are made

    def init(self, name: str, value: np.ndarray) -> str:
        """A named constant; shape constants are shared by name, so the first definition stands."""
        self.inits.setdefault(name, numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], std: float) -> str:
        if self.given is not None:
            value = self.given[name].astype(np.float32)
            assert value.shape == shape, (name, value.shape, shape)
            return self.init(name, value)
        if self.data is not None:
            return self.external(name, shape, std)
        return self.init(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def external(self, name: str, shape: tuple[int, ...], std: float) -> str:
        """A weight written straight into the external data file, some rows at a time (the generator fills C order:
        the values are the in-memory model's), so a model larger than RAM can be made; with `zeros`, a hole of a
        sparse file (its sizes without its bytes: enough to plan a build)."""
        assert self.data is not None
        length = 4 * int(np.prod(shape))
        if not self.zeros:
            rows = max(1, (64 << 20) // (8 * int(np.prod(shape[1:]))))
            for r in range(0, shape[0], rows):
                block = self.rng.standard_normal((min(rows, shape[0] - r), *shape[1:])) * std
                self.data.write(block.astype(np.float32).tobytes())
        t = TensorProto(name=name, dims=shape, data_type=TensorProto.FLOAT)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", Path(self.data.name).name), ("offset", self.offset), ("length", length)):
            t.external_data.add(key=k, value=str(v))
        self.offset += length
        self.data.seek(self.offset)
        self.inits.setdefault(name, t)
        return name

    def op(self, op: str, inputs: list[str], scope: str, **attrs: object) -> str:
        name = f"{scope}/{op}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [name + "_output_0"], name=name, **attrs))
        return name + "_output_0"

    def rms_norm(self, x: str, scope: str, dim: int, eps: float) -> str:
        gain = self.weight(f"{scope}.weight", (dim,), 0.0) if self.given is not None else \
            self.init(f"{scope}.weight", (1.0 + 0.1 * self.rng.standard_normal(dim)).astype(np.float32))
        sq = self.op("Mul", [x, x], scope)
        mean = self.op("ReduceMean", [sq], scope, axes=[-1], keepdims=1)
        rms = self.op("Sqrt", [self.op("Add", [mean, self.init(f"{scope}.eps", np.float32(eps))], scope)], scope)
        return self.op("Mul", [self.op("Div", [x, rms], scope), gain], scope)


def decoder(cfg: Config, seed: int = 23, weights: dict[str, np.ndarray] | None = None, data: Path | None = None,
            zeros: bool = False) -> onnx.ModelProto:
    """The decoder with random weights (seeded), or with `weights` by initializer name (trained ones). With `data`,
    the matrices are written into that file as they are made (save the model in its directory); `zeros`: left as
    holes of a sparse file."""
    with open(data, "wb") if data is not None else nullcontext() as f:
        b = _Builder(np.random.default_rng(seed), weights, f, zeros)
        model = _decoder(cfg, b, seed)
        if f is not None:
            f.truncate(b.offset)
    return model


def _decoder(cfg: Config, b: _Builder, seed: int) -> onnx.ModelProto:
    hd, h, kvh = cfg.head_dim, cfg.hidden, cfg.kv_heads
    embed = b.weight("model.embed_tokens.weight", (cfg.vocab, h), 0.5)
    x = b.op("Gather", [embed, "input_ids"], "/model/embed_tokens")

    # Additive causal + padding mask [batch, 1, seq, past+seq] from the 2-D attention_mask and the positions.
    s = "/model/attn_mask"
    total = b.op("Gather", [b.op("Shape", ["attention_mask"], s), b.init("one_i64", np.int64(1))], s, axis=0)
    key_pos = b.op("Range", [b.init("zero_i64", np.int64(0)), total, "one_i64"], s)
    key_pos = b.op("Reshape", [key_pos, b.init("shape_1_1_1_m1", np.array([1, 1, 1, -1], np.int64))], s)
    query_pos = b.op("Unsqueeze", ["position_ids", b.init("axes_1_3", np.array([1, 3], np.int64))], s)
    causal = b.op("LessOrEqual", [key_pos, query_pos], s)
    present_keys = b.op("Equal", [b.op("Unsqueeze", ["attention_mask", b.init("axes_1_2", np.array([1, 2], np.int64))], s),
                                  "one_i64"], s)
    mask = b.op("Where", [b.op("And", [causal, present_keys], s), b.init("mask_zero", np.float32(0)),
                          b.init("mask_neg", np.float32(MASK_NEG))], s)

    # Rotary tables, gathered by position: [batch, 1, seq, head_dim]
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(cfg.max_positions, dtype=np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    s = "/model/rotary_emb"
    axis1 = b.init("axes_1", np.array([1], np.int64))
    cos = b.op("Unsqueeze", [b.op("Gather", [b.init("cos_cached", np.cos(ang).astype(np.float32)), "position_ids"], s), axis1], s)
    sin = b.op("Unsqueeze", [b.op("Gather", [b.init("sin_cached", np.sin(ang).astype(np.float32)), "position_ids"], s), axis1], s)
    half = b.init("rope_split", np.array([hd // 2, hd // 2], np.int64))

    def rope(t: str, scope: str) -> str:
        lo, hi = f"{scope}/split_lo", f"{scope}/split_hi"
        b.nodes.append(helper.make_node("Split", [t, half], [lo, hi], name=f"{scope}/Split", axis=-1))
        rotated = b.op("Concat", [b.op("Neg", [hi], scope), lo], scope, axis=-1)
        return b.op("Add", [b.op("Mul", [t, cos], scope), b.op("Mul", [rotated, sin], scope)], scope)

    def heads(t: str, n: int, scope: str) -> str:  # [B, S, n*hd] -> [B, n, S, hd]
        t = b.op("Reshape", [t, b.init(f"shape_00{n}{hd}", np.array([0, 0, n, hd], np.int64))], scope)
        return b.op("Transpose", [t], scope, perm=[0, 2, 1, 3])

    def repeat_kv(t: str, scope: str) -> str:  # [B, kvh, T, hd] -> [B, heads, T, hd]
        if cfg.heads == kvh:
            return t
        u = b.op("Unsqueeze", [t, b.init("axes_2", np.array([2], np.int64))], scope)
        rep = b.op("Concat", [u] * (cfg.heads // kvh), scope, axis=2)
        return b.op("Reshape", [rep, b.init(f"shape_0{cfg.heads}m1{hd}", np.array([0, cfg.heads, -1, hd], np.int64))], scope)

    std_in, std_mlp = 1 / np.sqrt(h), 4 / np.sqrt(cfg.intermediate)  # a strong MLP: continuations vary
    lora_rng = np.random.default_rng(seed + 1)  # apart: the base weights are the same with or without slots
    if cfg.lora_rank:
        b.init("lora_scaling", np.array([cfg.lora_alpha / cfg.lora_rank], np.float32))

    def proj(x: str, name: str, shape: tuple[int, int], std: float, scope: str) -> str:
        """x @ W, plus PEFT's LoRA branch (x @ lora_A) @ lora_B * scaling on the LORA_TARGETS. The base's lora_B
        is zeros (PEFT's init): without an adapter the model is the plain decoder."""
        y = b.op("MatMul", [x, b.weight(f"{name}.weight", shape, std)], scope)
        if not cfg.lora_rank or name.rsplit(".", 1)[-1] not in LORA_TARGETS:
            return y
        r = cfg.lora_rank
        a_ = b.init(f"{name}.lora_A.weight", (lora_rng.standard_normal((shape[0], r)) / np.sqrt(shape[0])).astype(np.float32))
        b_ = b.init(f"{name}.lora_B.weight", np.zeros((r, shape[1]), np.float32))
        up = b.op("MatMul", [b.op("MatMul", [x, a_], scope), b_], scope)
        return b.op("Add", [y, b.op("Mul", [up, "lora_scaling"], scope)], scope)

    for i in range(cfg.layers):
        p, w = f"/model/layers.{i}", f"model.layers.{i}"
        n = b.rms_norm(x, f"{p}/input_layernorm", h, cfg.eps)
        a = f"{p}/self_attn"
        q = rope(heads(proj(n, f"{w}.self_attn.q_proj", (h, h), std_in, a), cfg.heads, a), f"{a}/q_rot")
        k = rope(heads(proj(n, f"{w}.self_attn.k_proj", (h, kvh * hd), std_in, a), kvh, a), f"{a}/k_rot")
        v = heads(proj(n, f"{w}.self_attn.v_proj", (h, kvh * hd), std_in, a), kvh, a)
        b.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.key", k], [f"present.{i}.key"], name=f"{a}/Concat_k", axis=2))
        b.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.value", v], [f"present.{i}.value"], name=f"{a}/Concat_v", axis=2))
        kt = b.op("Transpose", [repeat_kv(f"present.{i}.key", a)], a, perm=[0, 1, 3, 2])
        scores = b.op("Mul", [b.op("MatMul", [q, kt], a), b.init(f"{w}.scale", np.float32(1 / np.sqrt(hd)))], a)
        probs = b.op("Softmax", [b.op("Add", [scores, mask], a)], a, axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, repeat_kv(f"present.{i}.value", a)], a)], a, perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, b.init(f"shape_00{h}", np.array([0, 0, h], np.int64))], a)
        x = b.op("Add", [x, b.op("MatMul", [ctx, b.weight(f"{w}.self_attn.o_proj.weight", (h, h), 4 * std_in)], a)], p)
        n = b.rms_norm(x, f"{p}/post_attention_layernorm", h, cfg.eps)
        m = f"{p}/mlp"
        gate = b.op("MatMul", [n, b.weight(f"{w}.mlp.gate_proj.weight", (h, cfg.intermediate), std_in)], m)
        up = b.op("MatMul", [n, b.weight(f"{w}.mlp.up_proj.weight", (h, cfg.intermediate), std_in)], m)
        act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate], m)], m), up], m)
        x = b.op("Add", [x, b.op("MatMul", [act, b.weight(f"{w}.mlp.down_proj.weight", (cfg.intermediate, h), std_mlp)], m)], p)
    x = b.rms_norm(x, "/model/norm", h, cfg.eps)
    head = b.op("Transpose", [embed], "/lm_head", perm=[1, 0])  # tied: the embedding, stored once
    b.nodes.append(helper.make_node("MatMul", [x, head], ["logits"], name="/lm_head/MatMul"))

    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", i64, ["batch_size", "total_sequence_length"]),
              helper.make_tensor_value_info("position_ids", i64, ["batch_size", "sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", f, ["batch_size", "sequence_length", cfg.vocab])]
    for i in range(cfg.layers):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", f,
                                                        ["batch_size", kvh, "past_sequence_length", hd]))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kv}", f,
                                                         ["batch_size", kvh, "total_sequence_length", hd]))
    graph = helper.make_graph(b.nodes, "llama_tiny", inputs, outputs, list(b.inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="ctxbuild-llm-decoder")
    # the checker serializes its argument (protobuf's 2 GB limit): a larger model is checked by path once saved
    if b.data is None and sum(len(t.raw_data) for t in graph.initializer) < 2**31 - 2**24:
        onnx.checker.check_model(model)
    return model


def genai_decoder(cfg: Config, seed: int = 23) -> onnx.ModelProto:
    """The same decoder in onnxruntime-genai's model-builder convention (what `python -m
    onnxruntime_genai.models.builder` writes for Llama): no position_ids; Q/K/V one fused MatMul; com.microsoft
    GroupQueryAttention with its rotary (cos/sin caches of head_dim / 2) and seqlens_k / total_sequence_length
    computed from attention_mask; SimplifiedLayerNormalization, then SkipSimplifiedLayerNormalization carrying the
    residual stream (its output 3); the LM head tied to the embedding. Same weights as decoder(cfg, seed)."""
    ref = decoder(cfg, seed)
    w = {t.name: numpy_helper.to_array(t) for t in ref.graph.initializer}
    b = _Builder(np.random.default_rng(seed))
    hd, h, kvh = cfg.head_dim, cfg.hidden, cfg.kv_heads
    ms = "com.microsoft"
    for name in ("model.embed_tokens.weight", "cos_cached", "sin_cached"):
        b.init(name, w[name] if name == "model.embed_tokens.weight" else w[name][:, : hd // 2])
    x = b.op("Gather", ["model.embed_tokens.weight", "input_ids"], "/model/embed_tokens")
    s = "/model/attn_mask"
    total = b.op("Cast", [b.op("Gather", [b.op("Shape", ["attention_mask"], s), b.init("one_i64", np.int64(1))], s, axis=0)], s, to=TensorProto.INT32)
    seqlens = b.op("Cast", [b.op("Sub", [b.op("ReduceSum", ["attention_mask", b.init("axes_1", np.array([1], np.int64))], s, keepdims=0),
                                         "one_i64"], s)], s, to=TensorProto.INT32)
    residual = None
    for i in range(cfg.layers):
        p, wn = f"/model/layers.{i}", f"model.layers.{i}"
        gain = b.init(f"{wn}.input_layernorm.weight", w[f"/model/layers.{i}/input_layernorm.weight"])
        if residual is None:
            n = b.op("SimplifiedLayerNormalization", [x, gain], f"{p}/input_layernorm", axis=-1, epsilon=cfg.eps)
        else:
            name = f"{p}/input_layernorm/SkipLayerNorm"
            n, residual = name + "/output_0", name + "/output_3"
            b.nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual_in, x, gain], [n, "", "", residual],
                                            name=name, domain=ms, epsilon=cfg.eps))
            x = residual
        residual = x
        qkv = np.concatenate([w[f"{wn}.self_attn.{k}_proj.weight"] for k in "qkv"], axis=1)
        a = f"{p}/attn"
        packed = b.op("MatMul", [n, b.init(f"{wn}.attn.qkv_proj.weight", qkv)], a)
        name = f"{a}/GroupQueryAttention"
        out = name + "/output_0"
        b.nodes.append(helper.make_node(
            "GroupQueryAttention", [packed, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens,
                                    total, "cos_cached", "sin_cached"], [out, f"present.{i}.key", f"present.{i}.value"],
            name=name, domain=ms, num_heads=cfg.heads, kv_num_heads=kvh, do_rotary=1, scale=float(1 / np.sqrt(hd))))
        o = b.op("MatMul", [out, b.init(f"{wn}.attn.o_proj.weight", w[f"{wn}.self_attn.o_proj.weight"])], a)
        name = f"{p}/post_attention_layernorm/SkipLayerNorm"
        n, x = name + "/output_0", name + "/output_3"
        b.nodes.append(helper.make_node("SkipSimplifiedLayerNormalization",
                                        [residual, o, b.init(f"{wn}.post_attention_layernorm.weight",
                                                             w[f"/model/layers.{i}/post_attention_layernorm.weight"])],
                                        [n, "", "", x], name=name, domain=ms, epsilon=cfg.eps))
        m = f"{p}/mlp"
        gate = b.op("MatMul", [n, b.init(f"{wn}.mlp.gate_proj.weight", w[f"{wn}.mlp.gate_proj.weight"])], m)
        up = b.op("MatMul", [n, b.init(f"{wn}.mlp.up_proj.weight", w[f"{wn}.mlp.up_proj.weight"])], m)
        act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate], m)], m), up], m)
        residual_in = x
        x = b.op("MatMul", [act, b.init(f"{wn}.mlp.down_proj.weight", w[f"{wn}.mlp.down_proj.weight"])], m)
    name = "/model/norm/SkipLayerNorm"
    b.nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [residual_in, x, b.init("model.norm.weight", w["/model/norm.weight"])],
                                    [name + "/output_0"], name=name, domain=ms, epsilon=cfg.eps))
    head = b.op("Transpose", ["model.embed_tokens.weight"], "/lm_head", perm=[1, 0])
    b.nodes.append(helper.make_node("MatMul", [name + "/output_0", head], ["logits"], name="/lm_head/MatMul"))
    inputs = [i for i in ref.graph.input if i.name != "position_ids"]
    graph = helper.make_graph(b.nodes, "llama_tiny_genai", inputs, list(ref.graph.output), list(b.inits.values()))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(ms, 1)],
                             ir_version=IR_VERSION, producer_name="ctxbuild-llm-decoder")


def lora_adapter(cfg: Config, seed: int, b_std: float = 0.02) -> dict[str, np.ndarray]:
    """One adapter for decoder(cfg) with lora_rank > 0, by slot name (PEFT's tensor names, in the ONNX MatMul
    layout [in, out]): A like PEFT's init (std 1/sqrt(in)), B small, as training leaves it."""
    rng = np.random.default_rng(seed)
    h, r, out = cfg.hidden, cfg.lora_rank, {"q_proj": cfg.hidden, "v_proj": cfg.kv_heads * cfg.head_dim}
    weights = {}
    for i in range(cfg.layers):
        for t in LORA_TARGETS:
            name = f"model.layers.{i}.self_attn.{t}"
            weights[f"{name}.lora_A.weight"] = (rng.standard_normal((h, r)) / np.sqrt(h)).astype(np.float32)
            weights[f"{name}.lora_B.weight"] = (rng.standard_normal((r, out[t])) * b_std).astype(np.float32)
    return weights


def prompts(cfg: Config, n: int, length: int, seed: int = 5) -> list[np.ndarray]:
    """Token-id prompts (int64, one per file): random ids stand in for a tokenizer's output."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, cfg.vocab, size=length, dtype=np.int64) for _ in range(n)]


def main(dest: Path) -> None:
    cfg = Config()
    dest.mkdir(parents=True, exist_ok=True)
    onnx.save(decoder(cfg), dest / "llama_tiny.onnx")
    d = dest / "prompts" / "llama_tiny"
    d.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(prompts(cfg, 4, 24)):
        np.save(d / f"prompt_{i:03d}.npy", p)
    # the LoRA example (recipes/llm_lora.yaml): the same decoder with rank-4 slots, two adapters
    from safetensors.numpy import save_file

    lora = Config(lora_rank=4)
    onnx.save(decoder(lora), dest / "llama_lora.onnx")
    d = dest / "adapters" / "llama_lora"
    d.mkdir(parents=True, exist_ok=True)
    for name, seed in (("chat", 31), ("summarize", 32)):
        save_file(lora_adapter(lora, seed), str(d / f"{name}.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
