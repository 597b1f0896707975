"""Prompt files of an `llm:` recipe: 1-D token-id .npy arrays, read in name order."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ctxbuild.errors import ActionError


def prompt_files(directory: Path, n: int) -> dict[str, Path]:
    """The first `n` prompts (role -> path), for discover_inputs: they join the action key."""
    return {f"prompt:{p.name}": p for p in sorted(directory.glob("*.npy"))[:n]}


def load_prompts(files: dict[str, Path]) -> list[np.ndarray]:
    if not files:
        raise ActionError("llm.prompts.dir holds no .npy prompt files",
                          "save 1-D integer arrays of token ids (np.save), one prompt a file")
    out = []
    for p in files.values():
        a = np.load(p)
        if a.ndim != 1 or a.dtype.kind not in "iu" or not len(a):
            raise ActionError(f"{p}: a prompt must be a non-empty 1-D array of integer token ids, not "
                              f"{a.dtype} {list(a.shape)}", "save token ids with np.save(path, np.array(ids))")
        out.append(a.astype(np.int64))
    return out
