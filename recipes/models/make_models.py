"""Generate the example models and calibration samples the recipes in recipes/ build.

Deterministic (seeded): running it twice writes byte-identical files, so the build cache stays warm.
Usage: python recipes/models/make_models.py [DEST]   (default: the directory of this script)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_decoder  # noqa: E402 - the LLM example's generator, beside this script

OPSET = 17
IR_VERSION = 10


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float = 0.2) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def tiny_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    """Conv-BN-Relu x2, global pool, classifier; batch dim symbolic (the recipe fixes it)."""
    c1, c2, classes = 16, 32, 10
    inits = [
        _init(rng, "w1", (c1, 3, 3, 3)), _init(rng, "b1", (c1,), 0.05),
        numpy_helper.from_array(np.abs(rng.standard_normal(c1)).astype(np.float32) + 0.5, "bn_s"),
        _init(rng, "bn_b", (c1,), 0.1), _init(rng, "bn_m", (c1,), 0.1),
        numpy_helper.from_array(np.abs(rng.standard_normal(c1)).astype(np.float32) + 0.5, "bn_v"),
        _init(rng, "w2", (c2, c1, 3, 3), 0.1), _init(rng, "b2", (c2,), 0.05),
        _init(rng, "wf", (c2, classes), 0.3), _init(rng, "bf", (classes,), 0.05),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc"),
    ]
    graph = helper.make_graph(nodes, "tiny_cnn",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 64, 64])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def mlp(rng: np.random.Generator) -> onnx.ModelProto:
    """A two-layer MLP over a token embedding: the shape of an NPU-friendly transformer block's FFN."""
    d, h = 64, 256
    inits = [_init(rng, "w1", (d, h), 0.1), _init(rng, "b1", (h,), 0.02),
             _init(rng, "w2", (h, d), 0.1), _init(rng, "b2", (d,), 0.02)]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="fc1_bias"),
        helper.make_node("Sigmoid", ["a1"], ["s1"], name="act_sig"),
        helper.make_node("Mul", ["a1", "s1"], ["g1"], name="act_silu"),
        helper.make_node("MatMul", ["g1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "b2"], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def lm_block(tokens: int) -> onnx.ModelProto:
    """A transformer FFN block over a token window; prefill and decode differ only in `tokens` and
    share every weight (same names, same values: seeded identically) -- what a weight-shared bundle dedupes."""
    rng = np.random.default_rng(7)
    d, h = 256, 1024
    inits = [_init(rng, "ffn.w_in", (d, h), 0.06), _init(rng, "ffn.b_in", (h,), 0.02),
             _init(rng, "ffn.w_out", (h, d), 0.03), _init(rng, "ffn.b_out", (d,), 0.02)]
    nodes = [
        helper.make_node("MatMul", ["hidden", "ffn.w_in"], ["m1"], name="ffn_in"),
        helper.make_node("Add", ["m1", "ffn.b_in"], ["a1"], name="ffn_in_bias"),
        helper.make_node("Sigmoid", ["a1"], ["s1"], name="act_sig"),
        helper.make_node("Mul", ["a1", "s1"], ["g1"], name="act_silu"),
        helper.make_node("MatMul", ["g1", "ffn.w_out"], ["m2"], name="ffn_out"),
        helper.make_node("Add", ["m2", "ffn.b_out"], ["a2"], name="ffn_out_bias"),
        helper.make_node("Add", ["a2", "hidden"], ["out"], name="residual"),
    ]
    graph = helper.make_graph(nodes, f"lm_block_t{tokens}",
                              [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, tokens, d])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, tokens, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


LORA_RANK = 8


def lora_mlp(rng: np.random.Generator, tokens: int = 16, d: int = 64, h: int = 128) -> onnx.ModelProto:
    """The MLP with a LoRA branch on both layers, PEFT-style: y = x@W + (x@lora_A)@lora_B * lora_scale.
    The base's lora_B are zeros (PEFT's init), so without an adapter the model is the plain MLP."""
    r = LORA_RANK
    inits = [_init(rng, "w1", (d, h), 0.1), _init(rng, "w2", (h, d), 0.1),
             _init(rng, "layer1.lora_A", (d, r), 0.1), numpy_helper.from_array(np.zeros((r, h), np.float32), "layer1.lora_B"),
             _init(rng, "layer2.lora_A", (h, r), 0.1), numpy_helper.from_array(np.zeros((r, d), np.float32), "layer2.lora_B"),
             numpy_helper.from_array(np.ones(1, np.float32), "lora_scale")]
    nodes = []
    for i, (src, w) in enumerate((("x", "w1"), ("g1", "w2")), start=1):
        nodes += [
            helper.make_node("MatMul", [src, w], [f"base{i}"], name=f"fc{i}"),
            helper.make_node("MatMul", [src, f"layer{i}.lora_A"], [f"down{i}"], name=f"lora{i}_down"),
            helper.make_node("MatMul", [f"down{i}", f"layer{i}.lora_B"], [f"up{i}"], name=f"lora{i}_up"),
            helper.make_node("Mul", [f"up{i}", "lora_scale"], [f"scaled{i}"], name=f"lora{i}_scale"),
            helper.make_node("Add", [f"base{i}", f"scaled{i}"], [f"a{i}" if i == 1 else "y"], name=f"lora{i}_add"),
        ]
        if i == 1:
            nodes += [helper.make_node("Sigmoid", ["a1"], ["s1"], name="act_sig"),
                      helper.make_node("Mul", ["a1", "s1"], ["g1"], name="act_silu")]
    graph = helper.make_graph(nodes, "lora_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def lora_weights(rng: np.random.Generator, scale: float = 0.1, d: int = 64, h: int = 128) -> dict[str, np.ndarray]:
    """One adapter's A/B weights for lora_mlp, by slot name."""
    r = LORA_RANK
    shapes = {"layer1.lora_A": (d, r), "layer1.lora_B": (r, h), "layer2.lora_A": (h, r), "layer2.lora_B": (r, d)}
    return {k: (rng.standard_normal(s) * scale).astype(np.float32) for k, s in shapes.items()}


def lora_adapters(dest: Path) -> None:
    """Three adapters in the three formats a recipe accepts (recipes/lora_mlp.yaml)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(11)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(lora_weights(rng), str(dest / "formal.safetensors"))
    # PEFT-style names in the file, mapped to the slots by the recipe's `tensors:`
    np.savez(dest / "casual.npz", **{f"base_model.{k}.weight": v for k, v in lora_weights(rng).items()})
    import onnxruntime as ort

    weights = lora_weights(rng)  # kept alive: the OrtValues borrow its memory
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(1)
    fmt.set_model_version(1)
    fmt.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in sorted(weights.items())})
    fmt.export_adapter(str(dest / "pirate.onnx_adapter"))


def lora_base(rng: np.random.Generator, tokens: int = 16, d: int = 64, h: int = 128) -> onnx.ModelProto:
    """lora_mlp's MLP without LoRA branches (x@W1 -> SiLU -> @W2, nodes `layer1`/`layer2`): the base of
    recipes/lora_alpha.yaml, whose adapters ctxbuild attaches as branches switched by lora_alpha."""
    inits = [_init(rng, "layer1.weight", (d, h), 0.1), _init(rng, "layer2.weight", (h, d), 0.1)]
    nodes = [helper.make_node("MatMul", ["x", "layer1.weight"], ["a1"], name="layer1"),
             helper.make_node("Sigmoid", ["a1"], ["s1"], name="act_sig"),
             helper.make_node("Mul", ["a1", "s1"], ["g1"], name="act_silu"),
             helper.make_node("MatMul", ["g1", "layer2.weight"], ["y"], name="layer2")]
    graph = helper.make_graph(nodes, "lora_base", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def peft_adapter(rng: np.random.Generator, modules: dict[str, tuple[int, int]], rank: int, scale: float = 0.1
                 ) -> dict[str, np.ndarray]:
    """One adapter in PEFT's layout and names: base_model.model.<module>.lora_A.weight [r, in], lora_B [out, r]."""
    out = {}
    for m, (n_in, n_out) in modules.items():
        out[f"base_model.model.{m}.lora_A.weight"] = (rng.standard_normal((rank, n_in)) * scale).astype(np.float32)
        out[f"base_model.model.{m}.lora_B.weight"] = (rng.standard_normal((n_out, rank)) * scale).astype(np.float32)
    return out


def images(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Smooth image-like samples (low-frequency patterns plus noise), not white noise."""
    yy, xx = np.meshgrid(np.linspace(0, 1, 64), np.linspace(0, 1, 64), indexing="ij")
    out = []
    for _ in range(n):
        fx, fy, phase = rng.uniform(1, 4, 3)
        base = np.stack([np.sin(2 * np.pi * (fx * xx + fy * yy) + phase + c) for c in range(3)])
        out.append(((base + 0.1 * rng.standard_normal(base.shape)) * 0.5 + 0.5)[None].astype(np.float32))
    return out


def main(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_cnn(np.random.default_rng(1)), dest / "tiny_cnn.onnx")
    onnx.save(mlp(np.random.default_rng(2)), dest / "mlp.onnx")
    onnx.save(lm_block(32), dest / "lm_prefill.onnx")
    onnx.save(lm_block(1), dest / "lm_decode.onnx")
    rng = np.random.default_rng(3)
    _samples(dest / "calib" / "tiny_cnn", [{"image": img} for img in images(rng, 8)])
    _samples(dest / "calib" / "mlp", [{"x": rng.standard_normal((1, 16, 64)).astype(np.float32)} for _ in range(4)])
    onnx.save(lora_mlp(np.random.default_rng(12)), dest / "lora_mlp.onnx")
    lora_adapters(dest / "adapters")
    _samples(dest / "calib" / "lora_mlp", [{"x": rng.standard_normal((1, 16, 64)).astype(np.float32)} for _ in range(4)])
    onnx.save(lora_base(np.random.default_rng(12)), dest / "lora_base.onnx")
    from safetensors.numpy import save_file  # a 4th adapter for lora_alpha.yaml: PEFT layout, rank 4, layer1 only

    save_file(peft_adapter(np.random.default_rng(13), {"layer1": (64, 128)}, 4), str(dest / "adapters" / "terse.safetensors"))
    for name, tokens in (("lm_prefill", 32), ("lm_decode", 1)):
        _samples(dest / "calib" / name,
                 [{"hidden": rng.standard_normal((1, tokens, 256)).astype(np.float32)} for _ in range(4)])
    llm_decoder.main(dest)  # the LLM example: a decoder and token-id prompts


def _samples(d: Path, samples: list[dict[str, np.ndarray]]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(samples):
        np.savez(d / f"sample_{i:03d}.npz", **sample)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
