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
        d = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise BadExportConfig(f"{path}: not readable JSON ({e}): fix it, or remove it") from None
    if not isinstance(d, dict):
        raise BadExportConfig(f"{path}: a JSON object was expected, not {type(d).__name__}: fix it, or remove it")
    return d


def _get(d: dict[str, Any], key: str, kind: str, where: Path, path: str = "") -> Any:
    """d[key] if it has the kind the runtime expects ("object", "count": a whole number >= 1, "id": >= 0, "ids": an
    id or a list of them, "text"), None when absent; anything else names the file and the field (a traceback before)."""
    value = d.get(key)
    if value is None:
        return None
    whole = isinstance(value, int) and not isinstance(value, bool)
    ok = {"object": isinstance(value, dict), "count": whole and value >= 1, "id": whole and value >= 0,
          "ids": (whole and value >= 0) or (isinstance(value, list) and bool(value) and all(
              isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)),
          "text": isinstance(value, str)}[kind]
    if not ok:
        what = {"object": "a JSON object", "count": "a whole number, 1 or more", "id": "a token id (0 or more)",
                "ids": "a token id or a list of them", "text": "a string"}[kind]
        raise BadExportConfig(f"{where}: {path}{key} is {json.dumps(value)[:60]}, not {what}: fix it, or remove it")
    return value


def read(model: Path) -> ExportConfig:
    """The fields the export's config files give (none when the model directory holds no such file); a field of the
    wrong type, or a special token id past the vocabulary, raises BadExportConfig naming the file and the field."""
    paths = files(model)
    found = {n: _json(p) for n, p in paths.items()}
    g_path, h_path = paths.get("genai_config.json", model), paths.get("config.json", model)
    genai = _get(found.get("genai_config.json", {}), "model", "object", g_path) or {}
    decoder = _get(genai, "decoder", "object", g_path, "model.") or {}
    hf = found.get("config.json", {})
    hf = {**(_get(hf, "text_config", "object", h_path) or {}), **hf}  # multimodal configs nest the decoder's fields
    values: dict[str, Any] = {}
    source: dict[str, str] = {}

    def take(key: str, name: str, value: Any) -> None:
        if key not in values and value is not None:
            values[key], source[key] = value, name

    take("head_dim", "genai_config.json", _get(decoder, "head_size", "count", g_path, "model.decoder."))
    take("kv_heads", "genai_config.json", _get(decoder, "num_key_value_heads", "count", g_path, "model.decoder."))
    take("vocab", "genai_config.json", _get(genai, "vocab_size", "count", g_path, "model."))
    heads = _get(hf, "num_attention_heads", "count", h_path)
    hidden = _get(hf, "hidden_size", "count", h_path)
    take("head_dim", "config.json", _get(hf, "head_dim", "count", h_path) or (hidden // heads if heads and hidden else None))
    take("kv_heads", "config.json", _get(hf, "num_key_value_heads", "count", h_path) or heads)
    take("vocab", "config.json", _get(hf, "vocab_size", "count", h_path))
    generation = found.get("generation_config.json", {})
    for key in SPECIAL:
        take(key, "genai_config.json", _get(genai, key, "ids", g_path, "model."))
        take(key, "generation_config.json", _get(generation, key, "ids", paths.get("generation_config.json", model)))
        take(key, "config.json", _get(hf, key, "ids", h_path))
        take(key, "tokenizer_config.json", _token_id(found.get("tokenizer_config.json", {}), key.removesuffix("_id"),
                                                     paths.get("tokenizer_config.json", model)))
    special = {k: values.pop(k) for k in SPECIAL if k in values}
    if "pad_token_id" not in special and "eos_token_id" in special:  # Hugging Face exports often name no pad:
        eos = special["eos_token_id"]  # transformers' generate pads with the EOS then, never with id 0 (maybe BOS)
        special["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
        source["pad_token_id"] = source["eos_token_id"]
    search = _get(found.get("genai_config.json", {}), "search", "object", g_path) or {}
    check_special(special, values.get("vocab"), {k: model.parent / source[k] for k in special})
    return ExportConfig(values.get("head_dim"), values.get("kv_heads"), values.get("vocab"), special, search, source)


def check_special(special: dict[str, Any], vocab: int | None, where: dict[str, Path]) -> None:
    """Every special token id inside the vocabulary (it failed only in the build's last action before)."""
    if not vocab:
        return
    for key, value in special.items():
        for i in value if isinstance(value, list) else [value]:
            if i >= vocab:
                raise BadExportConfig(f"{where[key]}: {key} {i} is past the vocabulary ({vocab} tokens): fix it, "
                                      "or remove it")


def _token_id(tok: dict[str, Any], key: str, where: Path) -> int | None:
    """tokenizer_config.json names special tokens by string; `added_tokens_decoder` maps ids to them."""
    token = tok.get(key)
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    added = _get(tok, "added_tokens_decoder", "object", where) or {}
    for i, t in added.items():
        if isinstance(t, dict) and t.get("content") == token:
            if not i.isdigit():
                raise BadExportConfig(f"{where}: added_tokens_decoder key {i!r} is not a token id: fix it, or remove it")
            return int(i)
    return None


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
