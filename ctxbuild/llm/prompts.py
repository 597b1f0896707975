"""Prompt files of an `llm:` recipe, read in name order: 1-D token-id `.npy` arrays, or text (`.txt`: one prompt
a file; `.jsonl`: one a line, a JSON string or {"text": ...}) tokenized with the export's own tokenizer.json
(the `tokenizers` library, which Hugging Face's exporters' tokenizer files are written for)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxbuild.errors import ActionError

if TYPE_CHECKING:  # numpy where prompts are read: the planner only lists them
    import numpy as np

TEXT = (".txt", ".jsonl")
# the quality gates' evaluation text unless llm.eval.text (llm/quality.py): 734 words of plain English prose written for
# ctxbuild (rivers, bread, weather, libraries, music, stars), shipped in the package
DEFAULT_TEXT = Path(__file__).with_name("eval_text.txt")
SUFFIXES = (".npy", *TEXT)


def prompt_files(directory: Path, n: int) -> dict[str, Path]:
    """The first `n` prompt files (role -> path), for discover_inputs: they join the action key."""
    return {f"prompt:{p.name}": p for p in sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES)[:n]}


def has_text(directory: Path) -> bool:
    """Whether the directory holds text prompts (which need a tokenizer)."""
    return any(p.suffix in TEXT for p in directory.iterdir())


def tokenizer_of(action: Any) -> Path | None:
    """The tokenizer.json an llm action's text prompts are read with (its `prompt_tokenizer` input), if any."""
    return Path(action.inputs["prompt_tokenizer"]) if "prompt_tokenizer" in action.inputs else None


def load_prompts(files: dict[str, Path], n: int, tokenizer: Path | None = None) -> list[np.ndarray]:
    """The first `n` prompts of `files` as int64 token ids; text ones through `tokenizer` (a tokenizer.json)."""
    import numpy as np

    if not files:
        raise ActionError("llm.prompts.dir holds no prompt files (.npy token ids, .txt or .jsonl text)",
                          "save 1-D integer arrays of token ids (np.save), or the prompts as text, one a file")
    out: list[np.ndarray] = []
    for p in files.values():
        if p.suffix == ".npy":
            a = np.load(p)
            if a.ndim != 1 or a.dtype.kind not in "iu" or not len(a):
                raise ActionError(f"{p}: a prompt must be a non-empty 1-D array of integer token ids, not "
                                  f"{a.dtype} {list(a.shape)}", "save token ids with np.save(path, np.array(ids))")
            out.append(a.astype(np.int64))
        else:
            out += [_encode(t, tokenizer, p) for t in _texts(p)]
    return out[:n]


def _texts(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":
        return [text.removesuffix("\n")]
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise ActionError(f"{path}:{i}: not a JSON line", 'one prompt a line: "text" or {"text": "..."}') from None
        item = item.get("text") if isinstance(item, dict) else item
        if not isinstance(item, str):
            raise ActionError(f"{path}:{i}: a prompt line is a JSON string or {{\"text\": ...}}", "quote the prompt")
        found.append(item)
    return found


def _encode(text: str, tokenizer: Path | None, where: Path) -> np.ndarray:
    if tokenizer is None:
        raise ActionError(f"{where}: a text prompt, and the recipe names no tokenizer.json",
                          "list the export's tokenizer.json under llm.tokenizer, or keep it beside the model")
    import numpy as np
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tokenizer)).encode(text).ids
    if not ids:
        raise ActionError(f"{where}: a prompt tokenizes to nothing", "give a prompt with text in it")
    return np.array(ids, np.int64)
