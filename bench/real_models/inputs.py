"""Realistic inputs, rendered locally and seeded: text lines and pages drawn with PIL's built-in FreeType
font on paper-like backgrounds (gradient, noise, slight blur), and indoor scenes with people standing, sitting
and lying on the floor; normalized the way each model's own package preprocesses them (PP-OCR det / PicoDet:
ImageNet mean/std; PP-OCR rec: (x - 0.5) / 0.5; YOLOv8: x / 255)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .models import MODELS

if TYPE_CHECKING:  # PIL is imported where it draws: the module loads without it
    from PIL import Image, ImageDraw

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


def _person(draw: "ImageDraw.ImageDraw", rng: np.random.Generator, x: float, y: float, size: float,
            lying: bool) -> None:
    """A clothed figure with its feet at (x, y), `size` px tall: head, torso and limbs bent at the joints;
    lying: the same body along the floor."""
    skin = tuple(int(c) for c in rng.choice([(224, 172, 140), (198, 134, 96), (141, 85, 54), (255, 205, 170)]))
    shirt, trousers = (tuple(int(c) for c in rng.integers(20, 230, 3)) for _ in range(2))
    angle = float(rng.uniform(1.35, 1.75)) if lying else float(rng.uniform(-0.12, 0.12))
    c, s = np.cos(angle), np.sin(angle)

    def at(u: float, v: float) -> tuple[float, float]:  # body coordinates (u across, v up from the feet)
        return (x + u * c + v * s, y - v * c + u * s)

    def limb(points: list[tuple[float, float]], width: float, fill: tuple[int, ...]) -> None:
        pts = [at(u, v) for u, v in points]
        draw.line(pts, fill=fill, width=max(2, int(width)), joint="curve")
        for p in pts:
            draw.ellipse([p[0] - width / 2, p[1] - width / 2, p[0] + width / 2, p[1] + width / 2], fill=fill)

    w = size * 0.11
    swing = [float(rng.uniform(-0.15, 0.15)) * size for _ in range(4)]
    for side in (-1, 1):  # legs: hip, knee, foot
        limb([(side * w * 0.5, size * 0.5), (side * w * 0.6 + swing[side], size * 0.26), (side * w * 0.7, 0)],
             w * 0.9, trousers)
    limb([(0, size * 0.5), (0, size * 0.78)], w * 2.2, shirt)  # torso
    for side in (-1, 1):  # arms: shoulder, elbow, hand
        elbow = (side * w * 1.6 + swing[side + 1] * 0.5, size * 0.62)
        limb([(side * w * 1.1, size * 0.76), elbow, (side * w * 1.4 + swing[side + 1], size * 0.48)], w * 0.7,
             shirt)
    hx, hy = at(0, size * 0.89)
    r = size * 0.07
    draw.ellipse([hx - r, hy - r * 1.2, hx + r, hy + r * 1.2], fill=skin)


def scene(rng: np.random.Generator, h: int, w: int) -> "Image.Image":
    """A room: wall and floor in two tones, a window or a piece of furniture, one to three people (some lying,
    as a fall detector is meant to see), lit unevenly, with sensor noise and a slight blur."""
    from PIL import Image, ImageDraw, ImageFilter

    horizon = int(h * rng.uniform(0.45, 0.65))
    wall, floor = (rng.integers(90, 230, 3), rng.integers(40, 170, 3))
    img = np.empty((h, w, 3), np.float32)
    img[:horizon], img[horizon:] = wall, floor
    draw_img = Image.fromarray(img.astype(np.uint8))
    draw = ImageDraw.Draw(draw_img)
    x0 = int(rng.integers(0, w // 2))
    if rng.random() < 0.5:  # a window
        draw.rectangle([x0, int(h * 0.1), x0 + int(w * 0.25), int(horizon * 0.7)], fill=(200, 220, 240),
                       outline=(60, 50, 40), width=6)
    else:  # a table
        draw.rectangle([x0, horizon - int(h * 0.12), x0 + int(w * 0.3), horizon], fill=tuple(int(c) for c in
                       rng.integers(60, 140, 3)))
    for _ in range(int(rng.integers(1, 4))):
        size = float(rng.uniform(0.3, 0.7)) * h
        lying = bool(rng.random() < 0.5)
        _person(draw, rng, float(rng.uniform(0.05, 0.7)) * w, float(rng.uniform(horizon, h * 0.97)), size, lying)
    light = np.linspace(rng.uniform(0.6, 1.0), rng.uniform(0.8, 1.2), w)[None, :, None]
    out = np.asarray(draw_img, np.float32) * light + rng.normal(0, 5, (h, w, 3))
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(0.8))


def render(name: str, seed: int) -> np.ndarray:
    """One NCHW float32 sample for model `name`."""
    m = MODELS[name]
    rng = np.random.default_rng(seed)
    if m.kind in MORE_KINDS:
        return MORE_KINDS[m.kind](rng, m.shape).astype(np.float32)
    _, _, h, w = m.shape
    if m.kind == "text_line":
        x = np.asarray(text_line(rng, h, w), np.float32) / 255.0
        x = (x - 0.5) / 0.5
    elif m.kind == "scene":
        x = np.asarray(scene(rng, h, w), np.float32) / 255.0
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


# More kinds (vision families): captchas, click-captcha scenes, faces, rotated pages. Each renderer returns the
# model's input array whole (layout and normalization as the model's own package feeds it).
_GLYPHS = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghjkmnpqrstuvwxyz23456789"


def _noise_lines(draw: "ImageDraw.ImageDraw", rng: np.random.Generator, w: int, h: int, n: int) -> None:
    for _ in range(n):
        pts = [(float(rng.uniform(0, w)), float(rng.uniform(0, h))) for _ in range(3)]
        draw.line(pts, fill=tuple(int(c) for c in rng.integers(40, 200, 3)), width=int(rng.integers(1, 3)))


def captcha(rng: np.random.Generator, h: int, w: int) -> "Image.Image":
    """A text captcha: 4-6 letters and digits, each its own colour, size and tilt, overlapping a little, over a
    speckled tinted background crossed by interference lines, slightly blurred."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    bg = rng.integers(180, 256, 3)
    img = Image.fromarray(np.clip(bg + rng.normal(0, 18, (h, w, 3)), 0, 255).astype(np.uint8))
    n = int(rng.integers(4, 7))
    x = float(rng.uniform(2, 10))
    step = (w - 12) / n
    for ch in rng.choice(list(_GLYPHS), n):
        size = int(rng.integers(int(h * 0.55), int(h * 0.85)))
        tile = Image.new("RGBA", (size + 8, size + 8), (0, 0, 0, 0))
        ImageDraw.Draw(tile).text((4, -size // 6), str(ch), font=ImageFont.load_default(size=size),
                                  fill=tuple(int(c) for c in rng.integers(0, 150, 3)) + (255,))
        tile = tile.rotate(float(rng.uniform(-30, 30)), resample=Image.BILINEAR, expand=True)
        img.paste(tile, (int(x), int(rng.uniform(0, max(1, h - tile.height)))), tile)
        x += step * float(rng.uniform(0.8, 1.05))
    draw = ImageDraw.Draw(img)
    _noise_lines(draw, rng, w, h, int(rng.integers(2, 5)))
    for _ in range(int(w * h * 0.01)):  # dots
        px, py = int(rng.integers(0, w)), int(rng.integers(0, h))
        draw.point((px, py), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    return img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 0.8))))


def click_captcha(rng: np.random.Generator, size: int) -> "Image.Image":
    """A click captcha as a character detector sees it: a photo-like background (blurred colour blobs), 3-5
    large outlined characters scattered and tilted, letterboxed into size x size with grey 114 (YOLOX's pad)."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    w, h = size, int(size * rng.uniform(0.5, 0.75))
    img = Image.fromarray(np.broadcast_to(rng.integers(60, 200, 3), (h, w, 3)).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(8, 16))):
        x, y, r = float(rng.uniform(0, w)), float(rng.uniform(0, h)), float(rng.uniform(20, 120))
        draw.ellipse([x - r, y - r, x + r, y + r], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(6, 14))))
    for ch in rng.choice(list(_GLYPHS), int(rng.integers(3, 6))):
        s = int(rng.integers(36, 64))
        tile = Image.new("RGBA", (s + 12, s + 12), (0, 0, 0, 0))
        ImageDraw.Draw(tile).text((6, -s // 8), str(ch), font=ImageFont.load_default(size=s), stroke_width=2,
                                  fill=tuple(int(c) for c in rng.integers(0, 256, 3)) + (255,),
                                  stroke_fill=(0, 0, 0, 255) if rng.random() < 0.5 else (255, 255, 255, 255))
        tile = tile.rotate(float(rng.uniform(-40, 40)), resample=Image.BILINEAR, expand=True)
        img.paste(tile, (int(rng.uniform(0, w - tile.width)), int(rng.uniform(0, h - tile.height))), tile)
    out = Image.new("RGB", (size, size), (114, 114, 114))
    out.paste(img, (0, 0))
    return out


def _face(draw: "ImageDraw.ImageDraw", rng: np.random.Generator, cx: float, cy: float, r: float) -> None:
    """A frontal face of radius r at (cx, cy): hair, skin oval, eyebrows, eyes with pupils, nose and mouth."""
    skin = tuple(int(c) for c in rng.choice([(224, 172, 140), (198, 134, 96), (141, 85, 54), (255, 205, 170)]))
    hair = tuple(int(c) for c in rng.integers(10, 120, 3))
    draw.ellipse([cx - r * 1.05, cy - r * 1.35, cx + r * 1.05, cy + r * 0.6], fill=hair)
    draw.ellipse([cx - r * 0.85, cy - r * 1.1, cx + r * 0.85, cy + r * 1.15], fill=skin)
    shade = tuple(max(0, c - 60) for c in skin)
    for side in (-1, 1):
        ex, ey = cx + side * r * 0.35, cy - r * 0.2
        draw.line([ex - r * 0.2, ey - r * 0.22, ex + r * 0.2, ey - r * 0.25], fill=hair, width=max(1, int(r / 10)))
        draw.ellipse([ex - r * 0.16, ey - r * 0.08, ex + r * 0.16, ey + r * 0.08], fill=(240, 240, 240))
        draw.ellipse([ex - r * 0.07, ey - r * 0.07, ex + r * 0.07, ey + r * 0.07], fill=(30, 20, 10))
    draw.line([cx, cy - r * 0.1, cx - r * 0.08, cy + r * 0.25, cx + r * 0.05, cy + r * 0.3], fill=shade,
              width=max(1, int(r / 12)))
    smile = float(rng.uniform(0.1, 0.25))
    draw.arc([cx - r * 0.35, cy + r * 0.35 - r * smile, cx + r * 0.35, cy + r * 0.6 + r * smile], 10, 170,
             fill=(150, 50, 60), width=max(1, int(r / 10)))


def faces(rng: np.random.Generator, h: int, w: int, *, crop: bool = False) -> "Image.Image":
    """A room with one to three faces (radius 8-25% of the height), lit unevenly, with noise and blur; crop: one
    face filling the frame with the jitter of a detector's candidate box (what MTCNN's R-Net and O-Net see)."""
    from PIL import Image, ImageDraw, ImageFilter

    big = 4 * max(h, w) if crop else 0  # crops are drawn large, then shrunk as the app resizes a box
    W, H = (big, big) if crop else (w, h)
    img = Image.fromarray(np.broadcast_to(rng.integers(60, 230, 3), (H, W, 3)).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):  # furniture, pictures on the wall
        x0, y0 = float(rng.uniform(0, W)), float(rng.uniform(0, H))
        draw.rectangle([x0, y0, x0 + rng.uniform(0.1, 0.4) * W, y0 + rng.uniform(0.1, 0.4) * H],
                       fill=tuple(int(c) for c in rng.integers(30, 230, 3)))
    if crop:
        _face(draw, rng, W * (0.5 + rng.uniform(-0.08, 0.08)), H * (0.52 + rng.uniform(-0.08, 0.08)),
              W * float(rng.uniform(0.32, 0.42)))
        img = img.resize((w, h), Image.BILINEAR)
    else:
        for _ in range(int(rng.integers(1, 4))):
            r = float(rng.uniform(0.08, 0.25)) * h
            _face(draw, rng, float(rng.uniform(r, w - r)), float(rng.uniform(r * 1.3, h - r * 1.2)), r)
    light = np.linspace(rng.uniform(0.6, 1.0), rng.uniform(0.8, 1.2), w)[None, :, None]
    out = np.asarray(img, np.float32) * light + rng.normal(0, 4, (h, w, 3))
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(0.6))


def _chw(img: "Image.Image") -> np.ndarray:
    return np.asarray(img, np.float32).transpose(2, 0, 1)[None]


def _captcha_input(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """ddddocr: grey, x / 255, [1, 1, 64, W]."""
    return (np.asarray(captcha(rng, shape[2], shape[3]).convert("L"), np.float32) / 255.0)[None, None]


def _click_captcha_input(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """ddddocr's detector (YOLOX): BGR pixels 0-255, not normalized."""
    return np.ascontiguousarray(_chw(click_captcha(rng, shape[2]))[:, ::-1])


def _faces_input(rng: np.random.Generator, shape: tuple[int, ...], crop: bool) -> np.ndarray:
    """MTCNN: NHWC, (x - 127.5) / 128."""
    return ((np.asarray(faces(rng, shape[1], shape[2], crop=crop), np.float32) - 127.5) * 0.0078125)[None]


def _rotated_page_input(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A document page turned by 0, 90, 180 or 270 degrees (what an orientation classifier tells apart),
    ImageNet mean/std."""
    page = text_page(rng, shape[2], shape[3], blocks=True).rotate(90 * int(rng.integers(4)))
    x = np.asarray(page, np.float32) / 255.0
    return ((x - _MEAN) / _STD).transpose(2, 0, 1)[None]


MORE_KINDS = {
    "captcha": _captcha_input,
    "click_captcha": _click_captcha_input,
    "faces": lambda rng, shape: _faces_input(rng, shape, False),
    "face_crop": lambda rng, shape: _faces_input(rng, shape, True),
    "rotated_page": _rotated_page_input,
}
