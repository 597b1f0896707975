"""Speech as a streaming VAD's app feeds it (the silero VADs' tests): each espeak-ng sentence of tests/speech/,
padded with silence, cut into 512-sample chunks, the model run on the CPU call after call with its state carried;
the picked calls' inputs saved as samples (.npz, sr among them)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

SPEECH_DIR = Path(__file__).parent / "speech"  # espeak-ng sentences at 16 kHz (make_speech.py there)
CHUNK = 512  # the silero VADs at 16 kHz: 512 new samples per call
# (file, chunk indices): silence before the sentence, its onset, mid-speech, the silence after it
PICKS = {"cal": [(0, [5, 11, 40, 104]), (1, [8, 12, 60, 120])], "verify": [(2, [6, 13, 50, 110])]}

State = dict[str, np.ndarray]


def record_calls(model: Path, root: Path, start: Callable[[], State],
                 feeds: Callable[[np.ndarray, State], State], carry: Callable[[State, list[np.ndarray]], State]) -> None:
    """`start()`: the state before a sentence; `feeds(chunk, state)`: one call's inputs; `carry(feeds, outputs)`:
    the state the next call takes."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    files = sorted(SPEECH_DIR.glob("speech_*.npy"))
    for sub, picks in PICKS.items():
        (root / sub).mkdir()
        for index, steps in picks:
            x = np.load(files[index]).astype(np.float32) / 32768
            x = np.concatenate([np.zeros(CHUNK * 10, np.float32), x, np.zeros(CHUNK * 40, np.float32)])
            state = start()
            for k in range(max(steps) + 1):
                call = feeds(x[None, k * CHUNK:(k + 1) * CHUNK], state)
                if k in steps:
                    np.savez(root / sub / f"s{index}_{k:03d}.npz", **call)
                state = carry(call, sess.run(None, call))
