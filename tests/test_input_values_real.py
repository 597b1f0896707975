"""silero-vad 6.2.3 (its wheel ships silero_vad.onnx): the whole network sits in both branches of
`If(sr == 16000)` on the sample-rate input, beside a recurrent state input. Built as a user meets it: prepare refuses
the If and prints `input_values: {sr: 16000}` (the value the samples hold); pasted, it builds at fp16 and at auto
on SM8650 and verifies against the model as shipped, run with sr = 16000 on speech. Opt-in: pytest -m slow."""
from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytestmark = pytest.mark.slow

SPEECH_DIR = Path(__file__).parent / "speech"  # espeak-ng sentences at 16 kHz (make_speech.py there)
CHUNK, CONTEXT = 512, 64  # silero-vad at 16 kHz: 512 new samples per call, after the last 64 of the previous one
# (file, chunk indices): silence before the sentence, its onset, mid-speech, the silence after it
PICKS = {"cal": [(0, [5, 11, 40, 104]), (1, [8, 12, 60, 120])], "verify": [(2, [6, 13, 50, 110])]}


def _model() -> Path:
    try:
        dist = metadata.distribution("silero-vad")
    except metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps 'silero-vad==6.2.3'")
    return Path(str(dist.locate_file("silero_vad/data/silero_vad.onnx")))


def _samples(model: Path, root: Path) -> None:
    """Chunks of speech as the app feeds them: the model run over each sentence (padded with silence) on the CPU,
    the state and the context carried from call to call; the picked calls' inputs saved, sr among them."""
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    files = sorted(SPEECH_DIR.glob("speech_*.npy"))
    for sub, picks in PICKS.items():
        (root / sub).mkdir()
        for index, steps in picks:
            x = np.load(files[index]).astype(np.float32) / 32768
            x = np.concatenate([np.zeros(CHUNK * 10, np.float32), x, np.zeros(CHUNK * 40, np.float32)])
            state, context = np.zeros((2, 1, 128), np.float32), np.zeros((1, CONTEXT), np.float32)
            for k in range(max(steps) + 1):
                feeds = {"input": np.concatenate([context, x[None, k * CHUNK:(k + 1) * CHUNK]], axis=1),
                         "state": state, "sr": np.array(16000, np.int64)}
                if k in steps:
                    np.savez(root / sub / f"s{index}_{k:03d}.npz", **feeds)
                _, state = sess.run(None, feeds)
                context = feeds["input"][:, -CONTEXT:]


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
    r = ctxbuild("build", str(recipe), "-o", str(root / "out"))
    assert r.code == 1, r.text
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED prepare/")]
    assert "If 'If_0' takes its branch from input sr: if the app always passes sr = 16000" in line, line
    pasted = re.search(r"`(input_values: [^`]*)`", line)[1]
    assert pasted == "input_values: {sr: 16000}"

    recipe.write_text(recipe.read_text() + pasted + "\n")
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
    # measured: a16w8 rejected on the CPU (9.7 dB), a16w8-pc 18.7 dB on the state, a16w16 0.999938 / 39.1 dB
    assert search["winner"] == "a16w16", search
    result = json.loads((root / "out" / "SM8650" / "vad_auto" / "vad_auto_verify.json").read_text())
    assert result["passed"] and result["reference"] == "original"
