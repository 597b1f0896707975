"""An `llm:` recipe's files are read at plan time as the actions will read them, and again when each action reads
them (issue 46): a bad prompt, tokenizer or export config is one line naming the file (exit 2, no traceback), and a
tokenizer link retargeted out of the project after a first build is refused by the next build of the same OUT."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from ctxbuild.errors import RecipeError
from ctxbuild.recipes import recipe
from tests.conftest import keep_only

EXPORT = Path(__file__).parents[1] / "exports" / "llama_builder"  # a real onnxruntime-genai builder export


def _tree(tmp_path: Path, **llm: object) -> Path:
    """The builder export with its token-id prompts, and a recipe over it; returns the recipe."""
    export = tmp_path / "export"
    shutil.copytree(EXPORT, export)
    spec = {"model": "export/model.onnx", "sequence_lengths": [16, 1], "context_lengths": [64], "precision": "fp16",
            "prompts": {"dir": "export/prompts", "samples": 2, "verify": 2}, **llm}
    (tmp_path / "chat.yaml").write_text(json.dumps({"targets": ["SM8650"], "llm": spec}))
    return tmp_path / "chat.yaml"


def _refused(f: Path, *says: str) -> str:
    with pytest.raises(RecipeError) as e:
        recipe.load([f])
    line = str(e.value)
    assert line.startswith(f"{f}:") and "\n" not in line and all(s in line for s in says), line
    return line


def _vocab() -> int:
    return json.loads((EXPORT / "genai_config.json").read_text())["model"]["vocab_size"]


def test_the_export_as_given_loads(tmp_path: Path) -> None:
    f = _tree(tmp_path)
    (tmp_path / "export" / "prompts" / "0.txt").write_text("The static graphs.")
    assert recipe.load([f]).recipes[0].llm is not None


@pytest.mark.parametrize("name, content, says", [
    ("00.txt", b"\xff\xfe not UTF-8", "not UTF-8 text (byte 0xff at offset 0)"),
    ("00.npy", "object", "not a .npy array of token ids"),
    ("00.npy", "past", "is outside the model's vocabulary"),
    ("00.npy", "negative", "is outside the model's vocabulary"),
    ("00.txt", "directory", "a prompt must be a regular file, not a directory"),
])
def test_a_bad_prompt_file_is_named_at_plan_time(tmp_path: Path, name: str, content: object, says: str) -> None:
    f = _tree(tmp_path)
    p = tmp_path / "export" / "prompts" / name
    p.unlink(missing_ok=True)
    if content == "object":
        np.save(p, np.array([{"ids": [1, 2]}], dtype=object), allow_pickle=True)
    elif content in ("past", "negative"):
        np.save(p, np.array([1, _vocab() + 7 if content == "past" else -3], np.int64))
    elif content == "directory":
        p.mkdir()
    else:
        p.write_bytes(content)  # type: ignore[arg-type]
    _refused(f, name, says)


def test_a_tokenizer_json_that_is_not_one_is_named(tmp_path: Path) -> None:
    f = _tree(tmp_path)
    (tmp_path / "export" / "prompts" / "0.txt").write_text("hello")
    (tmp_path / "export" / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    _refused(f, "tokenizer.json: not a tokenizer.json the tokenizers library reads")


@pytest.mark.parametrize("name, body, says", [
    ("genai_config.json", {"model": []}, "genai_config.json: model is [], not a JSON object"),
    ("genai_config.json", "[1, 2]", "genai_config.json: a JSON object was expected, not list"),
    ("genai_config.json", {"model": {"decoder": {"head_size": "64"}}}, 'model.decoder.head_size is "64", not a whole'),
    ("config.json", {"num_attention_heads": "8", "hidden_size": 64}, 'num_attention_heads is "8", not a whole number'),
    ("config.json", {"text_config": 3}, "config.json: text_config is 3, not a JSON object"),
    ("tokenizer_config.json", {"eos_token": "</s>", "added_tokens_decoder": []}, "added_tokens_decoder is [], not"),
    ("generation_config.json", {"eos_token_id": "2"}, 'generation_config.json: eos_token_id is "2", not a token id'),
    ("generation_config.json", {"eos_token_id": [2, True]}, "eos_token_id is [2, true], not a token id"),
])
def test_a_malformed_export_config_is_named(tmp_path: Path, name: str, body: object, says: str) -> None:
    f = _tree(tmp_path)
    path = tmp_path / "export" / name
    if name != "genai_config.json":  # the builder's own config wins over the others: take it away for theirs
        (tmp_path / "export" / "genai_config.json").unlink()
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    _refused(f, name, says)


@pytest.mark.parametrize("where", ["genai_config.json", "generation_config.json"])
def test_special_ids_past_the_vocabulary_are_refused_at_plan_time(tmp_path: Path, where: str) -> None:
    f = _tree(tmp_path)
    cfg = tmp_path / "export" / "genai_config.json"
    genai = json.loads(cfg.read_text())
    if where == "genai_config.json":
        genai["model"]["pad_token_id"] = _vocab() + 100
    else:  # the builder's config names none; generation_config.json's then counts, against the graph's vocabulary
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            genai["model"].pop(key, None)
        genai["model"].pop("vocab_size", None)
        (tmp_path / "export" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 10 ** 6]}))
    cfg.write_text(json.dumps(genai))
    _refused(f, where, "past the vocabulary")


def test_a_tokenizer_file_named_like_a_built_binary_is_named_so(tmp_path: Path) -> None:
    f = _tree(tmp_path, tokenizer=["export/chat_1_of_1_qnn.bin"])
    shutil.copy(EXPORT / "tokenizer.json", tmp_path / "export" / "chat_1_of_1_qnn.bin")
    _refused(f, "chat_1_of_1_qnn.bin", "named like a file the build writes there", "*_qnn.bin context binaries")


TINY = """llm:
  model: models/llama_tiny.onnx
  sequence_lengths: [16, 1]
  context_lengths: [64]
  parts: 1
  precision: fp16
  prompts: {dir: models/prompts/llama_tiny, samples: 1, verify: 1}
  generate: 2
  tokenizer: [tok/tokenizer.json]
targets: [SM8650]
"""


def test_a_tokenizer_link_retargeted_after_a_build_is_refused_by_the_next(tree: Path, tmp_path: Path,
                                                                           ctxbuild, cache_dir: Path) -> None:
    """The link is retargeted with its directory's mtime kept (as rsync -t or a restore would leave it): the plan is
    current, so only the check when the file is read can see it. Before: the secret was copied into OUT and the
    cache's blobs, exit 0."""
    keep_only(tree)
    (tree / "llm.yaml").write_text(TINY)
    (tree / "tok").mkdir()
    shutil.copy(EXPORT / "tokenizer.json", tree / "models" / "tokenizer.json")
    link = tree / "tok" / "tokenizer.json"
    link.symlink_to("../models/tokenizer.json")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--no-verify")
    assert r.code == 0, r.text
    shipped = out / "SM8650" / "llm" / "tokenizer.json"
    assert shipped.read_bytes() == (EXPORT / "tokenizer.json").read_bytes()
    secret = tmp_path / "elsewhere" / "secret.json"
    secret.parent.mkdir()
    secret.write_text('{"secret": "not for the cache"}')
    st = (tree / "tok").stat()
    link.unlink()
    link.symlink_to(secret)
    os.utime(tree / "tok", ns=(st.st_atime_ns, st.st_mtime_ns))
    r = ctxbuild("build", str(tree), "-o", str(out), "--no-verify")
    assert r.code == 2, r.text
    assert "Traceback" not in r.text
    [failed] = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED")]
    assert f"{link} (now {secret}) is outside" in failed, r.err
    found = [p for d in (out, cache_dir) for p in d.rglob("*") if p.is_file() and b"not for the cache" in p.read_bytes()]
    assert not found, found
