"""Made the speech samples beside this file, once, by hand (CI has no espeak-ng): `python make_speech.py`.

Each is a sentence spoken by espeak-ng (Debian's espeak-ng 1.51, 22050 Hz mono int16), resampled to 16 kHz
(the rate speech front ends take) by cutting its spectrum at 8 kHz, kept as int16 at the level espeak-ng wrote
(peaks near -3 dBFS). Tests make louder and quieter takes by scaling these."""
from __future__ import annotations

import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

RATE = 16000
SPOKEN = (("en-us", 160, 50, "open the settings and choose a new language"),
          ("en-gb", 150, 70, "the meeting was moved to tuesday morning"),
          ("en-us+f3", 175, 60, "please send the shipping address to the customer"))


def speak(voice: str, speed: int, pitch: int, text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        wav = Path(d) / "s.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(wav), text],
                       check=True)
        with wave.open(str(wav)) as w:
            rate, x = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), np.int16)
    n = round(x.size * RATE / rate)
    spectrum = np.fft.rfft(x.astype(np.float64))[:n // 2 + 1]
    y = np.fft.irfft(spectrum, n) * (n / x.size)
    return np.clip(np.round(y), -32768, 32767).astype(np.int16)


if __name__ == "__main__":
    here = Path(__file__).parent
    for i, spoken in enumerate(SPOKEN):
        np.save(here / f"speech_{i}.npy", speak(*spoken))
