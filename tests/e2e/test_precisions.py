"""One precision vocabulary end to end (ctxbuild/recipes/precisions.py): every alias a recipe may write loads as the
table's name, and what the planner, the search's candidates, the summary and the pins print is that name."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ctxbuild.recipes import precisions, quantization
from ctxbuild.recipes import recipe as recipes
from tests.conftest import RECIPES

GRAPH_SPELLINGS = [(s, p.name) for p in precisions.TABLE if p.graph for s in (p.name, *p.aliases)]
LLM_SPELLINGS = [(s, p.name) for p in precisions.TABLE if p.llm for s in (p.name, *p.aliases)]


def test_the_table_names_every_precision_once() -> None:
    spelled = [s for p in precisions.TABLE for s in (p.name, *p.aliases)]
    assert len(spelled) == len(set(spelled)), "a spelling names two precisions"
    for p in precisions.TABLE:
        assert p.name == p.name.lower() and p.means
        if p.activations:  # a quantized precision's name is its bit widths, as AI Hub writes them
            assert p.name == precisions.name_of(p.activations, p.weights)


@pytest.mark.parametrize("spelled, name", GRAPH_SPELLINGS)
def test_a_model_recipe_takes_every_alias_as_the_table_name(tree: Path, spelled: str, name: str) -> None:
    body = (tree / "tiny_cnn.yaml").read_text().replace("precision: w8a16", f"precision: {spelled}")
    if name == "qdq":  # a QDQ model is what qdq takes: the float one is refused before the precision matters
        pytest.skip("qdq needs an already-quantized model (tests/e2e/test_quantized_io.py builds one)")
    (tree / "tiny_cnn.yaml").write_text(body)
    loaded = {r.name: r for r in recipes.load([tree / "tiny_cnn.yaml"]).recipes}["tiny_cnn"]
    assert loaded.precision == name
    if precisions.quantized(name):  # the planner's and the summary's name for its settings is the table's
        [settings] = loaded.quantization
        assert quantization.describe(loaded.precision, settings) == name


@pytest.mark.parametrize("spelled, name", LLM_SPELLINGS)
def test_an_llm_recipe_takes_every_alias_as_the_table_name(tmp_path: Path, spelled: str, name: str) -> None:
    models = RECIPES / "models"
    if not (models / "llama_tiny.onnx").exists():
        pytest.skip("the example models are made by `make models`")
    tree = tmp_path / "recipes"
    shutil.copytree(models / "prompts" / "llama_tiny", tree / "models" / "prompts" / "llama_tiny")
    shutil.copy(models / "llama_tiny.onnx", tree / "models")
    shutil.copy(RECIPES / "_defaults.yaml", tree)
    body = (RECIPES / "llm_tiny.yaml").read_text()
    (tree / "llm_tiny.yaml").write_text(body.replace("precision: w8a16", f"precision: {spelled}"))
    loaded = recipes.load([tree / "llm_tiny.yaml"]).recipes[0]
    assert loaded.precision == name and loaded.llm.precision == name


def test_the_search_names_its_candidates_in_the_table_vocabulary() -> None:
    ladder = [quantization.label(quantization.settings(b)) for b in quantization.DEFAULT_LADDER]
    assert ladder == ["w8a16", "w8a16-pc", "w16a16"]
    for name in ladder:
        assert precisions.get(name.split("-")[0]).graph
    # the pin of a mixed answer, pasted as a one-rung ladder, keeps the vocabulary (it used to read a16w8-ovr)
    pasted = quantization.settings({"nodes": {"conv1": {"weights": "int16"}}})
    assert quantization.label(pasted) == "w8a16-mixed"
