"""`toolchain:` on an `llm:` recipe, at plan level: the chosen onnxruntime-qnn release is carried to every action
of the recipe (every published release builds its weight-shared bundles: tests/toolchains/test_old_toolchain_bundles.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ctxbuild.plan.planner import make_plan
from ctxbuild.recipes import recipe
from tests.conftest import keep_only
from tests.fake_tree import fake_tree


def _tree(tmp_path: Path, line: str) -> Path:
    tree = fake_tree(tmp_path / "recipes")
    keep_only(tree, "llm_tiny.yaml")
    f = tree / "llm_tiny.yaml"
    f.write_text(f.read_text() + line)
    return tree


@pytest.mark.parametrize("line", ['toolchain: "2.3.0"\n', 'toolchain: {qairt: "2.47"}\n'])
def test_the_toolchain_reaches_every_llm_action(tmp_path: Path, line: str) -> None:
    plan = make_plan(recipe.load([_tree(tmp_path, line)]), tmp_path / "out")
    kinds = {a.kind for a in plan.actions}
    assert {"llm_split", "llm_quantize", "bundle", "llm_part_eval", "llm_package", "llm_genai"} <= kinds
    installed = {"llm_genai", "llm_float_eval"}
    assert {a.toolchain for a in plan.actions if a.recipes == ["llm_tiny"] and a.kind not in installed} == \
        {"onnxruntime-qnn-2.3.0"}
    # onnxruntime-genai runs the config's CPU twin beside the installed onnxruntime it needs (>= 1.31); the float
    # export's perplexity and text are the reference every toolchain's build is measured against: one, installed
    assert {a.toolchain for a in plan.actions if a.kind in installed} == {None}


def test_the_installed_toolchain_plans_as_before(tmp_path: Path) -> None:
    plan = make_plan(recipe.load([_tree(tmp_path, "toolchain: installed\n")]), tmp_path / "out")
    assert plan.actions and {a.toolchain for a in plan.actions} == {None}
