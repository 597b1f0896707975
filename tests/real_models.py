"""A real public model for the opt-in slow tests, and realistic inputs for it.

PP-OCRv4's text recognizer (CNN + SVTR attention blocks, CTC head) ships inside the `rapidocr-onnxruntime`
wheel (`pip install -e '.[real-models]'`); it is found through the installed distribution's metadata without
importing the package (which would import OpenCV). Inputs are rendered text lines, normalized the way
rapidocr feeds the model ((x / 255 - 0.5) / 0.5). bench/real_models/ renders a fuller set; keep one copy when
both exist.
"""
from __future__ import annotations

from importlib import metadata
from pathlib import Path

import numpy as np

RECOGNIZER = ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx")
LINE_SHAPE = (1, 3, 48, 320)
WORDS = "invoice total amount date account number reference order price tax 2024 17.50 No. 0042 Berlin".split()


def recognizer() -> Path | None:
    """The recognizer's .onnx inside the installed wheel, or None when the package is not installed."""
    dist, rel = RECOGNIZER
    try:
        path = Path(str(metadata.distribution(dist).locate_file(rel)))
    except metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def text_line(seed: int) -> np.ndarray:
    """One NCHW float32 text line: dark words on a light, slightly noisy background."""
    rng = np.random.default_rng(seed)
    _, _, h, w = LINE_SHAPE
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:  # without Pillow: glyph-like dark strokes at text positions
        img = rng.uniform(200, 245) + rng.normal(0, 4, (h, w, 3))
        x = int(rng.integers(4, 12))
        while x < w - 12:
            cw = int(rng.integers(6, 14))
            for _ in range(int(rng.integers(2, 4))):
                y0 = int(rng.integers(10, 30))
                img[y0:y0 + int(rng.integers(2, 14)), x:x + int(rng.integers(2, cw))] = rng.uniform(0, 70)
            x += cw + int(rng.integers(1, 4)) + (int(rng.integers(6, 12)) if rng.random() < 0.2 else 0)
    else:
        page = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(205, 250, 3)))
        font = ImageFont.load_default(size=int(rng.integers(24, 32)))
        ink = int(rng.integers(0, 70))
        ImageDraw.Draw(page).text((int(rng.integers(2, 10)), int(rng.integers(4, 10))),
                                  " ".join(rng.choice(WORDS, 4)), fill=(ink, ink, ink), font=font)
        img = np.asarray(page, np.float32) + rng.normal(0, 4, (h, w, 3))
    x01 = np.clip(img, 0, 255).astype(np.float32) / 255.0
    return ((x01 - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def write_text_lines(d: Path, n: int, first_seed: int = 0, input_name: str = "x") -> Path:
    """n samples as .npz keyed by the model's input name (what calibration.dir / verify.dir hold)."""
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        np.savez(d / f"line_{first_seed + i:03d}.npz", **{input_name: text_line(first_seed + i)})
    return d
