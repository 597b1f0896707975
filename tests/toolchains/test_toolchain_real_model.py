"""A real public model built for two runtimes: the PP-OCRv4 text detector (from the rapidocr-onnxruntime wheel)
at int16 with per-channel weights, calibrated on rendered text pages, with the installed toolchain and with the
release devices on QAIRT 2.47 run (onnxruntime-qnn 2.3.0, provisioned on demand). Both variants must verify on
their own toolchain's simulator; the 2.47 one must load and run in a separate onnxruntime 1.24.4 +
onnxruntime-qnn 2.3.0 runtime."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.real_models.inputs import write_samples
from bench.real_models.models import MODELS, MissingModel, locate
from tests._old_runtime import load, old_runtime_python

pytestmark = pytest.mark.slow


def test_ocr_detector_for_two_runtimes(tmp_path: Path, ctxbuild) -> None:
    try:
        model = locate("ppocr_det")
    except MissingModel as e:
        pytest.skip(str(e))
    det = MODELS["ppocr_det"]
    tree = tmp_path / "recipes"
    write_samples("ppocr_det", tree / "cal", 4, first_seed=0)
    write_samples("ppocr_det", tree / "ver", 1, first_seed=100)
    (tree / "det.yaml").write_text(
        f"model: {model}\ninputs: {{{det.input}: {list(det.shape)}}}\nprecision: w8a16\n"
        "quantization: {per_channel: true}\ncalibration: {dir: cal}\n"
        "verify: {dir: ver, samples: 1, min_snr_db: 15, timeout_s: 1800}\ntargets: [SM8650]\n"
        'toolchain: [installed, {qairt: "2.47"}]\n')
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), timeout=3600)
    if r.code != 0 and "cannot provision toolchain" in r.err:
        pytest.skip(f"onnxruntime-qnn 2.3.0 cannot be provisioned here (offline?): {r.err[-300:]}")
    assert r.code == 0, r.text
    print(r.out)  # the summary: cosine and SNR of each variant (pytest -s)
    manifest = json.loads((out / "manifest.json").read_text())
    wrappers = {a["toolchain"]: a for a in manifest["artifacts"] if a["kind"] == "epcontext_model"}
    assert set(wrappers) == {"installed", "onnxruntime-qnn-2.3.0"}
    for a in wrappers.values():
        assert a["verification"]["status"] == "passed"
    old = wrappers["onnxruntime-qnn-2.3.0"]
    assert old["compatibility"]["qnn_sdk"].startswith("v2.47.0.")
    ran = load(old_runtime_python(), out / old["path"])
    assert ran["ok"] and len(ran["outputs"]) == 1, ran["error"]
