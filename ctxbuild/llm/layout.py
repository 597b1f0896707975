"""layout.json: what llm_split made (decoder shape, layer ranges per part, graphs) for the actions after it."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctxbuild.llm.static import GraphSpec


@dataclass(frozen=True)
class Layout:
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    hidden: int
    parts: list[tuple[int, int]]  # layer ranges [start, stop)
    graphs: list[GraphSpec]
    reference_tokens: list[list[int]]  # the original model's greedy continuation per check prompt (as many tokens
    # as the split's check and llm_genai's compare)
    special: dict[str, Any] = field(default_factory=dict)  # bos/eos/pad_token_id from the export's configs
    search: dict[str, Any] = field(default_factory=dict)  # the export's genai_config.json `search` options

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))

    @classmethod
    def read(cls, path: Path) -> "Layout":
        d = json.loads(path.read_text())
        return cls(d["layers"], d["kv_heads"], d["head_dim"], d["vocab"], d["hidden"], [tuple(r) for r in d["parts"]],
                   [GraphSpec(**g) for g in d["graphs"]], d["reference_tokens"], d.get("special", {}),
                   d.get("search", {}))

    def models(self, role: str, files: dict[str, str], cl: int | None = None) -> dict[tuple[int, int, int], Path]:
        """(part, ar, cl) -> the file of each graph under `role:<graph>` in `files` (only context length `cl`'s)."""
        return {(g.part, g.ar, g.cl): Path(files[f"{role}:{g.name}"]) for g in self.graphs if cl in (None, g.cl)}
