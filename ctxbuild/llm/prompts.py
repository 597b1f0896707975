"""Prompt files of an `llm:` recipe, read in name order: 1-D token-id `.npy` arrays, or text (`.txt`: one prompt
a file; `.jsonl`: one a line, a JSON string or {"text": ...}) tokenized with the export's own tokenizer.json
(the `tokenizers` library, which Hugging Face's exporters' tokenizer files are written for).

The plan reads them as the actions will (`check`): a directory named *.txt, non-UTF-8 text, an object .npy, a token
id past the vocabulary or a tokenizer.json that is not one each ended in a traceback in the first llm action before;
now each is one line naming the file at plan time (exit 2)."""
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
HINT = "prompts are 1-D integer token-id .npy files (np.save), UTF-8 .txt (one prompt a file) or .jsonl (one a line)"


class BadPrompt(ValueError):
    """A prompt file (or the tokenizer it needs) cannot be read: the message names the file and what is wrong."""


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
    if not files:
        raise ActionError("llm.prompts.dir holds no prompt files (.npy token ids, .txt or .jsonl text)",
                          "save 1-D integer arrays of token ids (np.save), or the prompts as text, one a file")
    try:
        return [ids for ids, _ in _read(list(files.values()), tokenizer)][:n]
    except BadPrompt as e:
        raise ActionError(str(e), HINT) from None


def check(directory: Path, n: int, tokenizer: Path | None, vocab: int | None) -> None:
    """Every prompt file the build reads (the first `n`), read as the actions read them, each id inside the
    vocabulary: BadPrompt naming the file otherwise."""
    for ids, where in _read(list(prompt_files(directory, n).values()), tokenizer):
        if vocab and (int(ids.max()) >= vocab or int(ids.min()) < 0):
            bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
            raise BadPrompt(f"{where}: token id {bad} is outside the model's vocabulary (0..{vocab - 1})")


def _read(files: list[Path], tokenizer: Path | None) -> list[tuple[np.ndarray, Path]]:
    import numpy as np

    out: list[tuple[np.ndarray, Path]] = []
    encoder = None
    for p in files:
        if not p.is_file():
            raise BadPrompt(f"{p}: a prompt must be a regular file, not {'a directory' if p.is_dir() else 'that'}")
        if p.suffix == ".npy":
            try:
                a = np.load(p, allow_pickle=False)  # an object array would run code from the file
            except (ValueError, OSError, EOFError) as e:
                raise BadPrompt(f"{p}: not a .npy array of token ids ({e})") from None
            if a.ndim != 1 or a.dtype.kind not in "iu" or not len(a):
                raise BadPrompt(f"{p}: a prompt must be a non-empty 1-D array of integer token ids, not "
                                f"{a.dtype} {list(a.shape)}")
            out.append((a.astype(np.int64), p))
            continue
        encoder = encoder or _tokenizer(tokenizer, p)
        out += [(_encode(t, encoder, p), p) for t in _texts(p)]
    return out


def _texts(path: Path) -> list[str]:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadPrompt(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    if path.suffix == ".txt":
        return [text.removesuffix("\n")]
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise BadPrompt(f'{path}:{i}: not a JSON line (one prompt a line: "text" or {{"text": "..."}})') from None
        item = item.get("text") if isinstance(item, dict) else item
        if not isinstance(item, str):
            raise BadPrompt(f"{path}:{i}: a prompt line is a JSON string or {{\"text\": ...}}")
        found.append(item)
    return found


def _tokenizer(tokenizer: Path | None, where: Path) -> Any:
    if tokenizer is None:
        raise BadPrompt(f"{where}: a text prompt, and the recipe names no tokenizer.json (list the export's "
                        "tokenizer.json under llm.tokenizer, or keep it beside the model)")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(tokenizer))
    except Exception as e:  # noqa: BLE001 - the library raises its own Exception for any file it cannot read
        raise BadPrompt(f"{tokenizer}: not a tokenizer.json the tokenizers library reads ({str(e)[:120]})") from None


def _encode(text: str, encoder: Any, where: Path) -> np.ndarray:
    import numpy as np

    ids = encoder.encode(text).ids
    if not ids:
        raise BadPrompt(f"{where}: a prompt tokenizes to nothing (give a prompt with text in it)")
    return np.array(ids, np.int64)
