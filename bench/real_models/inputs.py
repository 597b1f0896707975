"""Realistic inputs, rendered locally and seeded: text lines and pages drawn with PIL's built-in FreeType
font on paper-like backgrounds (gradient, noise, slight blur), normalized the way each model's own
package preprocesses them (PP-OCR det / PicoDet: ImageNet mean/std; PP-OCR rec: (x - 0.5) / 0.5)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .models import MODELS

WORDS = ("invoice total amount date account number reference customer order shipping address payment due "
         "quantity price description item tax subtotal balance thank you 2024 17.50 3,240.00 No. 0042 "
         "Berlin Paris Tokyo ctxbuild model layer quantization").split()
_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _paper(rng: np.random.Generator, w: int, h: int) -> "Image.Image":
    from PIL import Image

    base = rng.uniform(200, 250)
    grad = np.linspace(0, rng.uniform(-25, 25), w)[None, :] + np.linspace(0, rng.uniform(-25, 25), h)[:, None]
    tint = rng.uniform(-8, 8, 3)
    img = base + grad[..., None] + tint + rng.normal(0, 4, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _phrase(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def _ink(rng: np.random.Generator) -> tuple[int, int, int]:
    v = int(rng.integers(0, 70))
    return (v, v, int(min(255, v + rng.integers(0, 60))))


def text_line(rng: np.random.Generator, h: int, w: int) -> "Image.Image":
    from PIL import ImageDraw, ImageFilter, ImageFont

    img = _paper(rng, w, h)
    font = ImageFont.load_default(size=int(rng.integers(26, 34)))
    ImageDraw.Draw(img).text((int(rng.integers(2, 12)), int(rng.integers(4, 10))), _phrase(rng, 4), fill=_ink(rng),
                             font=font)
    return img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.2, 0.7))))


def text_page(rng: np.random.Generator, h: int, w: int, *, blocks: bool = False) -> "Image.Image":
    from PIL import ImageDraw, ImageFilter, ImageFont

    img = _paper(rng, w, h)
    draw = ImageDraw.Draw(img)
    y = int(rng.integers(10, 30))
    while y < h - 30:
        if blocks and rng.random() < 0.2:  # a figure or table box, as documents have
            bh = int(rng.integers(40, 120))
            x0 = int(rng.integers(10, w // 3))
            draw.rectangle([x0, y, min(w - 10, x0 + int(rng.integers(w // 3, w // 2))), y + bh],
                           outline=_ink(rng), width=2, fill=tuple(int(c) for c in rng.integers(150, 230, 3)))
            y += bh + 15
            continue
        size = int(rng.integers(14, 30))
        draw.text((int(rng.integers(8, 40)), y), _phrase(rng, int(rng.integers(2, 7))), fill=_ink(rng),
                  font=ImageFont.load_default(size=size))
        y += size + int(rng.integers(6, 24))
    return img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.2, 0.6))))


def render(name: str, seed: int) -> np.ndarray:
    """One NCHW float32 sample for model `name`."""
    m = MODELS[name]
    _, _, h, w = m.shape
    rng = np.random.default_rng(seed)
    if m.kind == "text_line":
        x = np.asarray(text_line(rng, h, w), np.float32) / 255.0
        x = (x - 0.5) / 0.5
    else:
        x = np.asarray(text_page(rng, h, w, blocks=m.kind == "document"), np.float32) / 255.0
        x = (x - _MEAN) / _STD
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def write_samples(name: str, d: Path, n: int, first_seed: int = 0) -> Path:
    """n samples as .npz keyed by the model's input name (what a recipe's calibration.dir holds)."""
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        np.savez(d / f"{name}_{first_seed + i:03d}.npz", **{MODELS[name].input: render(name, first_seed + i)})
    return d
