"""Greedy decoding through the static part graphs, as a device runtime does it: the prompt in chunks of the
largest AR, then one token at a time through the AR-1 graphs, the KV cache kept outside the graphs.

Cache layout per call (what the graphs' `attention_mask` input says): past slots [0, n) hold the n valid
positions, slots [n, CL - AR) are empty (masked), slots [CL - AR, CL) are the AR new positions, causal among
themselves. A chunk shorter than AR is padded at the end; padded positions are never written to the cache.

`Runner(part, ar, cl, feeds) -> outputs by name` hides where a graph runs (CPU EP on float or QDQ models,
the HTP simulator on compiled single-graph binaries), so every comparison goes through the same code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ctxbuild.llm import export_config
from ctxbuild.llm.canonical import MASK_NEG

Runner = Callable[[int, int, int, dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass
class Decoded:
    tokens: list[int]  # the greedy continuation (forced tokens when teacher-forced)
    logits: list[np.ndarray] = field(default_factory=list)  # [vocab] per generated step


def mask(n: int, valid_new: int, ar: int, cl: int) -> np.ndarray:
    past = cl - ar
    m = np.full((ar, cl), MASK_NEG, np.float32)
    m[:, :n] = 0.0
    causal = np.tril(np.ones((ar, ar), bool))
    causal[:, valid_new:] = False  # padded positions are keys for no one
    m[:, past:][causal] = 0.0
    return m[None, None]


class Chain:
    """The parts chained as a runtime runs them, the KV cache kept here: `step(tokens, width)` runs `tokens` (padded
    to the graph width `width`) through every part and returns the logits of each of them, [len(tokens), vocab]."""

    def __init__(self, run: Runner, parts: list[tuple[int, int]], kv_shape: tuple[int, int], cl: int) -> None:
        self.run, self.parts, self.cl = run, parts, cl
        self.kv_heads, self.head_dim = kv_shape
        self.cache = {(i, kv): np.zeros((self.kv_heads, 0, self.head_dim), np.float32)
                      for i in range(parts[-1][1]) for kv in ("key", "value")}

    def step(self, tokens: np.ndarray, width: int) -> np.ndarray:
        cl, cache = self.cl, self.cache
        n = cache[(0, "key")].shape[1]
        if n + len(tokens) > cl or n > cl - width:
            raise ValueError(f"prompt and continuation ({n + len(tokens)} tokens) exceed context length {cl}")
        ids = np.zeros((1, width), np.int64)
        ids[0, :len(tokens)] = tokens
        feeds = {"attention_mask": mask(n, len(tokens), width, cl),
                 "position_ids": (n + np.arange(width, dtype=np.int64))[None]}
        hidden: dict[str, np.ndarray] = {"input_ids": ids}
        for p, (start, stop) in enumerate(self.parts):
            f = dict(feeds, **hidden)
            for i in range(start, stop):
                for kv in ("key", "value"):
                    past = np.zeros((1, self.kv_heads, cl - width, self.head_dim), np.float32)
                    past[0, :, :n] = cache[(i, kv)]
                    f[f"past_key_values.{i}.{kv}"] = past
            got = self.run(p, width, cl, f)
            for i in range(start, stop):
                for kv in ("key", "value"):
                    new = got[f"present.{i}.{kv}"][0, :, :len(tokens)]
                    cache[(i, kv)] = np.concatenate([cache[(i, kv)], new], axis=1)
            hidden = {f"hidden_states.{stop}": got[f"hidden_states.{stop}"]} if p < len(self.parts) - 1 else {}
        return got["logits"][0, :len(tokens)]

    def prefill(self, ids: np.ndarray, ar: int) -> np.ndarray:
        """`ids` in chunks of `ar` (the last one padded); the logits of every position, [len(ids), vocab]."""
        return np.concatenate([self.step(ids[c:c + ar], ar) for c in range(0, len(ids), ar)])


def generate(run: Runner, parts: list[tuple[int, int]], kv_shape: tuple[int, int], prompt: np.ndarray,
             new_tokens: int, cl: int, ar: int, forced: list[int] | None = None) -> Decoded:
    """Greedy decode of `new_tokens` after `prompt` at context length `cl`, prompt chunks of `ar`. With
    `forced`, those tokens are fed instead of the argmax (teacher forcing: logits of two pipelines compare
    step by step on the same history)."""
    chain = Chain(run, parts, kv_shape, cl)
    out = Decoded([])
    logits = None
    for c in range(0, len(prompt), ar):
        logits = chain.step(prompt[c:c + ar], ar)[-1]
    assert logits is not None
    for s in range(new_tokens):
        out.logits.append(logits)
        token = forced[s] if forced is not None else int(logits.argmax())
        out.tokens.append(token)
        if s < new_tokens - 1:
            logits = chain.step(np.array([token]), 1)[-1]
    return out


Bound = dict[tuple[int, int, int], dict[str, np.ndarray]]  # per graph: LoRA slot values fed with every call


def cpu_runner(models: dict[tuple[int, int, int], Path], bound: Bound | None = None,
               config: dict[str, str] | None = None) -> Runner:
    """Sessions on the CPU EP, opened on first use: models[(part, ar, cl)]. `bound[(part, ar, cl)]`: values fed to
    that graph's slots (required inputs of a QDQ graph, overridable initializers of a float one). `config`: session
    config entries."""
    import onnxruntime as ort

    sessions: dict[tuple[int, int, int], Any] = {}
    bound = bound or {}

    def run(part: int, ar: int, cl: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        key = (part, ar, cl)
        if key not in sessions:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            for k, v in (config or {}).items():
                so.add_session_config_entry(k, v)
            sessions[key] = ort.InferenceSession(str(models[key]), so, providers=["CPUExecutionProvider"])
        s = sessions[key]
        names = [o.name for o in s.get_outputs()]
        given = {**bound.get(key, {}), **feeds}
        wanted = [i.name for i in s.get_inputs()] + [i.name for i in s.get_overridable_initializers() if i.name in given]
        # copies: an output array onnxruntime returns is a view of its session's activation arena, and one kept
        # (a hidden state recorded as the next part's calibration input, a recorded output) keeps the whole arena
        # resident after the session closed: a 32 MB output held 190 MB; 16 AR switches of a 1B-shape calibration
        # held GBs of closed sessions' arenas (docs/llm-reference.md, At LLM sizes)
        return {n: np.array(v) for n, v in zip(names, s.run(None, {n: given[n] for n in wanted}))}

    return run


def open_export(model: Path) -> tuple[Any, dict[str, np.ndarray]]:
    """A CPU session on the original dynamic export, and its past KV inputs, empty."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    past_inputs = [i for i in s.get_inputs() if i.name.startswith("past_key_values.")]
    cfg = export_config.read(model)  # for the dims the graph leaves symbolic (the model builder's head_dim)

    def dim(d: int | str, given: int | None) -> int:
        return d if isinstance(d, int) else given or 0

    return s, {i.name: np.zeros((1, dim(i.shape[1], cfg.kv_heads), 0, dim(i.shape[3], cfg.head_dim)), np.float32)
               for i in past_inputs}


def export_call(s: Any, ids: np.ndarray, n: int, past: dict[str, np.ndarray],
                slots: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """One call of the dynamic export: `ids` [1, k] after `n` cached positions (`past`)."""
    total = n + ids.shape[1]
    feeds = {**(slots or {}), "input_ids": ids, "attention_mask": np.ones((1, total), np.int64),
             "position_ids": np.arange(n, total, dtype=np.int64)[None], **past}
    # onnxruntime-genai's convention has no position_ids (the attention op derives them), nor optimum's Gemma
    got = s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})
    return dict(zip([o.name for o in s.get_outputs()], got))


def reference_generate(model: Path, prompt: np.ndarray, new_tokens: int, slots: dict[str, np.ndarray] | None = None,
                       opened: tuple[Any, dict[str, np.ndarray]] | None = None) -> Decoded:
    """Greedy decode with the original dynamic model (growing KV cache, 2-D attention_mask). `slots`: values for
    LoRA weights the model takes as inputs (fed where it has such an input). `opened`: open_export(model)'s
    InferenceSession, reused (opening a large export costs seconds)."""
    s, feeds = opened or open_export(model)
    ids, n, out = prompt[None].astype(np.int64), 0, Decoded([])
    for _ in range(new_tokens):
        got = export_call(s, ids, n, feeds, slots)
        logits = got["logits"][0, -1]
        out.logits.append(logits)
        out.tokens.append(int(logits.argmax()))
        feeds = {k: got[k.replace("past_key_values", "present")] for k in feeds}
        ids, n = np.array([[out.tokens[-1]]], np.int64), n + ids.shape[1]
    return out
