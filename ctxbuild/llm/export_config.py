"""What an exporter writes beside its decoder: `genai_config.json` (onnxruntime-genai's model builder),
`config.json`, `generation_config.json`, `tokenizer_config.json` (Hugging Face). Read for what the graph leaves
open (the builder's symbolic head_dim) and for what the runtime needs (the special-token ids, the vocabulary),
so neither is guessed.

Precedence per field: the export's own genai_config.json (the runtime config its exporter wrote), then
generation_config.json, config.json, tokenizer_config.json (a token's string mapped to its id)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILES = ("genai_config.json", "config.json", "generation_config.json", "tokenizer_config.json")
SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id")


class BadExportConfig(ValueError):
    """A config file beside the model does not parse: the message names it."""


@dataclass(frozen=True)
class ExportConfig:
    head_dim: int | None = None
    kv_heads: int | None = None
    vocab: int | None = None
    special: dict[str, Any] = field(default_factory=dict)  # bos/eos/pad_token_id -> id (eos may be a list)
    search: dict[str, Any] = field(default_factory=dict)  # genai_config.json's `search` (decoding options)
    source: dict[str, str] = field(default_factory=dict)  # field -> the file it came from


def files(model: Path) -> dict[str, Path]:
    """The exporter's config files beside `model` that exist, by name."""
    return {n: model.parent / n for n in FILES if (model.parent / n).is_file()}


def _json(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadExportConfig(f"{path}: not readable JSON ({e}): fix it, or remove it") from None
    return d if isinstance(d, dict) else {}


def read(model: Path) -> ExportConfig:
    """The fields the export's config files give (none when the model directory holds no such file)."""
    found = {n: _json(p) for n, p in files(model).items()}
    genai = found.get("genai_config.json", {}).get("model", {})
    decoder = genai.get("decoder", {})
    hf = found.get("config.json", {})
    hf = {**hf.get("text_config", {}), **hf}  # multimodal configs nest the decoder's fields
    values: dict[str, Any] = {}
    source: dict[str, str] = {}

    def take(key: str, name: str, value: Any) -> None:
        if key not in values and value is not None:
            values[key], source[key] = value, name

    take("head_dim", "genai_config.json", decoder.get("head_size"))
    take("kv_heads", "genai_config.json", decoder.get("num_key_value_heads"))
    take("vocab", "genai_config.json", genai.get("vocab_size"))
    heads = hf.get("num_attention_heads")
    take("head_dim", "config.json", hf.get("head_dim") or (hf["hidden_size"] // heads if heads and "hidden_size" in hf else None))
    take("kv_heads", "config.json", hf.get("num_key_value_heads") or heads)
    take("vocab", "config.json", hf.get("vocab_size"))
    for key in SPECIAL:
        take(key, "genai_config.json", genai.get(key))
        take(key, "generation_config.json", found.get("generation_config.json", {}).get(key))
        take(key, "config.json", hf.get(key))
        take(key, "tokenizer_config.json", _token_id(found.get("tokenizer_config.json", {}), key.removesuffix("_id")))
    special = {k: values.pop(k) for k in SPECIAL if k in values}
    if "pad_token_id" not in special and "eos_token_id" in special:  # Hugging Face exports often name no pad:
        eos = special["eos_token_id"]  # transformers' generate pads with the EOS then, never with id 0 (maybe BOS)
        special["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
        source["pad_token_id"] = source["eos_token_id"]
    search = found.get("genai_config.json", {}).get("search", {})
    return ExportConfig(values.get("head_dim"), values.get("kv_heads"), values.get("vocab"), special, search, source)


def _token_id(tok: dict[str, Any], key: str) -> int | None:
    """tokenizer_config.json names special tokens by string; `added_tokens_decoder` maps ids to them."""
    token = tok.get(key)
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    return next((int(i) for i, t in tok.get("added_tokens_decoder", {}).items() if t.get("content") == token), None)


def fix_symbolic_dims(model: Any, cfg: ExportConfig) -> None:
    """Give the KV cache's kv_heads and head_dim dims (past_key_values.* and present.*) and logits' vocabulary the
    export config's values where the graph leaves them symbolic (the builder writes head_dim as `kv_cache_dim`)."""
    want = {1: cfg.kv_heads, 3: cfg.head_dim}
    for v in (*model.graph.input, *model.graph.output):
        dims = v.type.tensor_type.shape.dim
        if v.name.startswith(("past_key_values.", "present.")) and len(dims) == 4:
            for axis, value in want.items():
                if not dims[axis].dim_value and value:
                    dims[axis].dim_value = value
        elif v.name == "logits" and dims and not dims[-1].dim_value and cfg.vocab:
            dims[-1].dim_value = cfg.vocab
