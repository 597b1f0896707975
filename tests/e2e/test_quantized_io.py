"""compile.quantized_io with the real EP: wrappers whose I/O are the HTP's uint16 tensors, the encodings in
the model's metadata, verification through them, and LoRA adapters bound as quantized values."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from ctxbuild.qnn.quantized_io import KEY, dequantize, quantize
from tests.conftest import TINY_CNN
from tests._qnn_models import cosine, cpu_run, qnn_session
from tests.e2e.test_lora import adapter_values, merged_model


def _recipe(tree: Path, name: str, body: str) -> Path:
    d = tree.parent / f"{name}_recipes"
    d.mkdir()
    (d / f"{name}.yaml").write_text(body.replace("models/", f"{tree}/models/"))
    return d


def _encodings(ctx: Path) -> dict:
    return json.loads(qnn_session(ctx).get_modelmeta().custom_metadata_map[KEY])


def test_wrapper_takes_and_gives_the_htp_types(tree: Path, tmp_path: Path, ctxbuild) -> None:
    d = _recipe(tree, "cnn", TINY_CNN + "precision: w8a16\n"
                "calibration: {dir: models/calib/tiny_cnn}\ncompile: {quantized_io: true}\ntargets: [SM8650]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(d), "-o", str(out))
    assert r.code == 0, r.text
    ctx = out / "SM8650" / "cnn" / "cnn_ctx.onnx"
    wrapper = onnx.load(ctx, load_external_data=False)
    assert [(i.name, i.type.tensor_type.elem_type) for i in wrapper.graph.input] == [("image", onnx.TensorProto.UINT16)]
    assert [(o.name, o.type.tensor_type.elem_type) for o in wrapper.graph.output] == [("logits", onnx.TensorProto.UINT16)]
    enc = _encodings(ctx)
    assert set(enc) == {"image", "logits"} and all(e["dtype"] == "uint16" and e["scale"] > 0 for e in enc.values())
    result = json.loads((out / "SM8650" / "cnn" / "cnn_verify.json").read_text())
    assert result["passed"] and result["outputs"]["logits"]["snr_db"] > 30, result  # float I/O: 34.4 dB

    # As an app does it: quantize the input with the recorded encoding, dequantize the output.
    x = np.load(tree / "models" / "calib" / "tiny_cnn" / "sample_001.npz")["image"]
    raw = qnn_session(ctx).run(None, {"image": quantize(x, enc["image"])})[0]
    assert raw.dtype == np.uint16
    ref = cpu_run(tree / "models" / "tiny_cnn.onnx", {"image": x})[0]
    assert cosine(dequantize(raw, enc["logits"]), ref) > 0.999


def test_lora_adapters_are_bound_quantized(tree: Path, tmp_path: Path, ctxbuild) -> None:
    text = (tree / "lora_mlp.yaml").read_text().replace("precision: w8a16", "precision: w8a16\ncompile: {quantized_io: true}")
    d = _recipe(tree, "lora_mlp", text + "targets: [SM8650]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(d), "-o", str(out))
    assert r.code == 0, r.text
    base_dir = out / "SM8650" / "lora_mlp"
    ctx = base_dir / "lora_mlp_ctx.onnx"
    enc = _encodings(ctx)
    assert {"x", "y", "layer1.lora_A", "layer1.lora_B"} <= set(enc)
    sess = qnn_session(ctx)
    x = np.load(tree / "models" / "calib" / "lora_mlp" / "sample_001.npz")["x"]
    no_adapter = dequantize(sess.run(None, {"x": quantize(x, enc["x"])})[0], enc["y"])
    for name in ("formal", "casual", "pirate"):
        binding = base_dir / "adapters" / f"{name}.onnx_adapter"
        values = adapter_values(binding)
        quantized = {k: v for k, v in values.items() if k in enc}
        assert quantized and all(v.dtype == np.uint16 for v in quantized.values()), values
        result = json.loads((base_dir / "adapters" / f"{name}_verify.json").read_text())
        assert result["passed"] and result["outputs"]["y"]["cosine"] > 0.9999, result  # against the float file

        lora = ort.LoraAdapter()
        lora.Load(str(binding))
        ro = ort.RunOptions()
        ro.add_active_adapter(lora)
        got = dequantize(sess.run(None, {"x": quantize(x, enc["x"])}, ro)[0], enc["y"])
        merged = {k: dequantize(v, enc[k]) if k in enc else v for k, v in values.items()}
        ref = cpu_run(merged_model(tree / "models" / "lora_mlp.onnx", merged, tmp_path / f"{name}.onnx"), {"x": x})[0]
        assert cosine(got, ref) > 0.999, (name, cosine(got, ref))
        assert cosine(got, no_adapter) < 0.99  # the adapter really changed the output


def test_quantized_io_refused_where_it_cannot_apply(tree: Path, tmp_path: Path, ctxbuild) -> None:
    d = _recipe(tree, "mlp", "model: models/mlp.onnx\nprecision: fp16\ncompile: {quantized_io: true}\n"
                "targets: [SM8650]\n")
    r = ctxbuild("build", str(d), "-o", str(tmp_path / "out"))
    assert r.code == 2 and "mlp.yaml:3: compile.quantized_io needs a quantized model" in r.err, r.text
    bundle = (tree / "lm_bundle.yaml").read_text().replace("models/", f"{tree}/models/").replace("[phones]", "[SM8650]")
    (d / "mlp.yaml").write_text(bundle + "compile: {quantized_io: true}\n")
    r = ctxbuild("build", str(d), "-o", str(tmp_path / "out"))
    assert r.code == 2 and "compile.quantized_io is not supported for bundles" in r.err, r.text
