"""silero-vad 6.2.3 (its wheel ships silero_vad.onnx): the whole network sits in both branches of
`If(sr == 16000)` on the sample-rate input, beside a recurrent state input. Built as a user meets it: prepare refuses
the If and prints `input_values: {sr: 16000}` (the value the samples hold); pasted, it builds at fp16 and at auto
on SM8650 and verifies against the model as shipped, run with sr = 16000 on speech. Opt-in: pytest -m slow."""
from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from tests._hints import failed_line, pasted
from tests._speech_calls import CHUNK, record_calls

pytestmark = pytest.mark.slow

CONTEXT = 64  # silero-vad at 16 kHz: each call's 512 new samples follow the last 64 of the previous one


def _model() -> Path:
    try:
        dist = metadata.distribution("silero-vad")
    except metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps 'silero-vad==6.2.3'")
    return Path(str(dist.locate_file("silero_vad/data/silero_vad.onnx")))


def _samples(model: Path, root: Path) -> None:
    """Chunks of speech as the app feeds them: the state and the context carried from call to call."""
    sr = np.array(16000, np.int64)
    record_calls(model, root, lambda: {"state": np.zeros((2, 1, 128), np.float32),
                                       "context": np.zeros((1, CONTEXT), np.float32)},
                 lambda x, st: {"input": np.concatenate([st["context"], x], axis=1), "state": st["state"], "sr": sr},
                 lambda call, out: {"state": out[1], "context": call["input"][:, -CONTEXT:]})


def _recipe(root: Path, model: Path, precision: str) -> Path:
    f = root / f"vad_{precision}.yaml"
    f.write_text(f"model: {model}\ninputs: {{input: [1, {CHUNK + CONTEXT}], state: [2, 1, 128]}}\n"
                 f"precision: {precision}\ntargets: [SM8650]\ncalibration: {{dir: cal}}\nverify: {{dir: verify}}\n")
    return f


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    model = _model()
    _samples(model, tmp_path)
    return tmp_path, model


def test_fp16_from_the_refusal_to_a_verified_build(tree: tuple[Path, Path], ctxbuild) -> None:
    root, model = tree
    recipe = _recipe(root, model, "fp16")
    line = failed_line(ctxbuild, recipe, root / "out", "prepare/")
    assert "If 'If_0' takes its branch from input sr: if the app always passes sr = 16000" in line, line
    line_to_paste = pasted(line, "input_values")
    assert line_to_paste == "input_values: {sr: 16000}"

    recipe.write_text(recipe.read_text() + line_to_paste + "\n")
    r = ctxbuild("build", str(recipe), "-o", str(root / "out"))
    assert r.code == 0, r.text
    result = json.loads((root / "out" / "SM8650" / "vad_fp16" / "vad_fp16_verify.json").read_text())
    assert result["passed"] and result["reference"] == "original" and result["coverage"]["cpu_nodes"] == 0
    # measured: output 0.999995 / 49.7 dB, stateN 0.999994 / 49.2 dB (the fp16 gate: 0.999 / 30 dB)
    assert all(o["cosine"] > 0.9999 and o["snr_db"] > 40 for o in result["outputs"].values()), result


def test_auto_finds_an_integer_precision(tree: tuple[Path, Path], ctxbuild) -> None:
    root, model = tree
    recipe = _recipe(root, model, "auto")
    recipe.write_text(recipe.read_text() + "input_values: {sr: 16000}\n")
    r = ctxbuild("build", str(recipe), "-o", str(root / "out"))
    assert r.code == 0, r.text
    search = json.loads((root / "out" / "SM8650" / "vad_auto" / "vad_auto_search.json").read_text())
    # measured: w8a16 rejected on the CPU (9.7 dB), w8a16-pc 18.7 dB on the state, w16a16 0.999938 / 39.1 dB
    assert search["winner"] == "w16a16", search
    result = json.loads((root / "out" / "SM8650" / "vad_auto" / "vad_auto_verify.json").read_text())
    assert result["passed"] and result["reference"] == "original"
