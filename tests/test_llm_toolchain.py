"""`toolchain:` on an `llm:` recipe, at plan level: the chosen onnxruntime-qnn release is carried to every action
of the recipe, and a release that cannot build weight-shared bundles (before 2.7) is refused with the line."""
from __future__ import annotations

from pathlib import Path

import pytest

from ctxbuild.errors import RecipeError
from ctxbuild.plan.planner import make_plan
from ctxbuild.recipes import recipe, toolchains
from tests.conftest import keep_only
from tests.fake_tree import fake_tree


def _tree(tmp_path: Path, line: str) -> Path:
    tree = fake_tree(tmp_path / "recipes")
    keep_only(tree, "llm_tiny.yaml")
    f = tree / "llm_tiny.yaml"
    f.write_text(f.read_text() + line)
    return tree


def test_the_toolchain_reaches_every_llm_action(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only one published release builds bundles (2.7.0, the installed one): to plan with a toolchain that is not the
    # installed one, the installed plugin reads as 2.6.0 (a version lookup; nothing is built or run).
    monkeypatch.setattr(toolchains, "version", lambda name: "2.6.0")
    plan = make_plan(recipe.load([_tree(tmp_path, 'toolchain: "2.7.0"\n')]), tmp_path / "out")
    kinds = {a.kind for a in plan.actions}
    assert {"llm_split", "llm_quantize", "bundle", "compile", "llm_eval", "llm_package"} <= kinds
    assert {a.toolchain for a in plan.actions if a.recipes == ["llm_tiny"]} == {"onnxruntime-qnn-2.7.0"}


def test_the_installed_toolchain_plans_as_before(tmp_path: Path) -> None:
    plan = make_plan(recipe.load([_tree(tmp_path, "toolchain: installed\n")]), tmp_path / "out")
    assert plan.actions and {a.toolchain for a in plan.actions} == {None}


def test_a_toolchain_without_bundles_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path, 'toolchain: "2.6.0"\n')
    with pytest.raises(RecipeError) as e:
        recipe.load([tree])
    line = len((tree / "llm_tiny.yaml").read_text().splitlines())
    assert e.value.message.startswith(f"{tree / 'llm_tiny.yaml'}:{line}: toolchain: bundle needs onnxruntime-qnn 2.7 "
                                      "or newer; this toolchain has 2.6.0"), e.value.message
