"""What a user bringing their own small ONNX model meets with the newest features: `verify --layers` on a
`precision: auto` recipe, a recipe's `outputs:` naming a tensor and the Relu after it, a tensor no input reaches,
quantization.nodes naming a node the cut left out. Real quantizer, QNN compiles and simulator runs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from tests._qnn_models import conv_model

CONV = "model: conv.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\n"


def _tree(d: Path, model: onnx.ModelProto, name: str, recipe: str) -> Path:
    """`name`.onnx, 4 calibration samples for it, and `name`.yaml holding `recipe`."""
    onnx.save(model, d / f"{name}.onnx")
    (d / "cal").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(4):
        np.savez(d / "cal" / f"s{i}.npz", **{v.name: rng.standard_normal(
            [x.dim_value for x in v.type.tensor_type.shape.dim]).astype(np.float32) for v in model.graph.input})
    (d / f"{name}.yaml").write_text(recipe)
    return d / f"{name}.yaml"


def test_layers_on_a_precision_search_diagnoses_the_candidate_it_ships_or_the_closest(tmp_path: Path,
                                                                                      ctxbuild) -> None:
    """`verify --layers` on a `precision: auto` recipe diagnoses the candidate the search ships (it crashed on the
    candidates' verifies, which hold no thresholds); when no candidate passes and none was compiled (every one
    rejected by the CPU screen), the CPU half of the diagnosis runs on the closest one. The result is written
    beside `<recipe>_search.json`."""
    recipe = _tree(tmp_path, conv_model(), "conv", CONV + "precision: auto\nquantization: [{}]\n"
                   "auto: {mixed: false, fp16: false}\n")
    out = tmp_path / "out"
    r = ctxbuild("verify", "--layers", "conv", str(recipe), "-o", str(out))
    assert r.code == 0, r.text
    d = json.loads((out / "SM8650" / "conv" / "conv_layers.json").read_text())
    assert (d["candidate"], d["graph"], d["target"]) == ("a16w8", "conv", "SM8650"), d
    assert d["outputs"]["features"]["htp"]["snr_db"] is not None and d["probe_runs"]  # the simulator's half ran
    assert "conv@SM8650: the search's answer, a16w8" in r.out, r.out

    recipe.write_text(CONV + "precision: auto\nquantization: [{}]\nauto: {mixed: false, fp16: false}\n"
                      "verify: {min_snr_db: 90}\n")
    r = ctxbuild("verify", "--layers", "conv", str(recipe), "-o", str(out))
    assert r.code == 1 and "Traceback" not in r.err, r.text
    d = json.loads((out / "SM8650" / "conv" / "conv_layers.json").read_text())
    assert d["candidate"] == "a16w8" and d["where"] == "quantization" and not d["probe_runs"], d
    assert "conv@SM8650: no candidate passed; the closest on the CPU screen, a16w8 (not compiled: the CPU half" in r.out

