"""`llm.prompts.dir` takes text (`.txt` a prompt, `.jsonl` a prompt a line), tokenized with the export's own
tokenizer.json, beside `.npy` token ids: the same ids the exporter's tokenizer gives, the tokenizer an input of
every action reading the prompts, and a text prompt with no tokenizer refused at plan time (exit 2)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ctxbuild.errors import ActionError, RecipeError
from ctxbuild.llm.prompts import load_prompts, prompt_files
from ctxbuild.plan.planner import make_plan
from ctxbuild.recipes import recipe

EXPORT = Path(__file__).parents[1] / "exports" / "llama_builder"
# the texts tests/exports/make_exports.py tokenized into prompts/00.npy and 01.npy
TEXTS = ["The static graphs.",
         "Every build checks it: the float model decodes the prompts, and the parts on the CPU."]


def test_text_prompts_are_the_exporters_token_ids(tmp_path: Path) -> None:
    (tmp_path / "00.txt").write_text(TEXTS[0] + "\n")
    (tmp_path / "01.jsonl").write_text(json.dumps(TEXTS[1]) + "\n\n" + json.dumps({"text": TEXTS[0]}) + "\n")
    got = load_prompts(prompt_files(tmp_path, 8), 8, EXPORT / "tokenizer.json")
    want = [np.load(EXPORT / "prompts" / f"{i:02d}.npy") for i in (0, 1, 0)]
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert len(load_prompts(prompt_files(tmp_path, 8), 2, EXPORT / "tokenizer.json")) == 2  # `samples` counts prompts
    (tmp_path / "02.jsonl").write_text("not json\n")
    with pytest.raises(ActionError, match=r"02.jsonl:1: not a JSON line"):
        load_prompts(prompt_files(tmp_path, 8), 8, EXPORT / "tokenizer.json")


def _tree(tmp_path: Path, tokenizer: bool) -> Path:
    export = tmp_path / "export"
    shutil.copytree(EXPORT, export, ignore=shutil.ignore_patterns("prompts", *([] if tokenizer else ["tokenizer.json"])))
    (export / "prompts").mkdir()
    for i, text in enumerate(TEXTS):
        (export / "prompts" / f"{i:02d}.txt").write_text(text)
    (tmp_path / "chat.yaml").write_text(json.dumps({"targets": ["SM8650"], "llm": {
        "model": "export/model.onnx", "sequence_lengths": [16, 1], "context_lengths": [64], "precision": "w8a16",
        "prompts": {"dir": "export/prompts", "samples": 2, "verify": 2}}}))
    return tmp_path / "chat.yaml"


def test_every_prompt_reader_has_the_tokenizer_as_an_input(tmp_path: Path) -> None:
    plan = make_plan(recipe.load([_tree(tmp_path, tokenizer=True)]), tmp_path / "out")
    readers = [a for a in plan.actions if a.kind in ("llm_split", "llm_quantize", "llm_genai")]
    assert {a.kind for a in readers} == {"llm_split", "llm_quantize", "llm_genai"}
    assert all(a.inputs["prompt_tokenizer"] == str(tmp_path / "export" / "tokenizer.json") for a in readers)


def test_text_prompts_without_a_tokenizer_are_refused(tmp_path: Path) -> None:
    f = _tree(tmp_path, tokenizer=False)
    with pytest.raises(RecipeError) as e:
        recipe.load([f])
    assert e.value.message.startswith(f"{f}:1: ") and "holds text prompts and there is no tokenizer.json" in e.value.message
