"""`llm.tokenizer`: the runtime's tokenizer files are copied beside genai_config.json by llm_package (inputs and
outputs of that action, so an edited tokenizer re-runs only it), and bad entries exit 2 with the recipe's line."""
from __future__ import annotations

from pathlib import Path

import pytest

from ctxbuild.errors import RecipeError
from ctxbuild.plan.planner import make_plan
from ctxbuild.recipes import recipe
from tests.conftest import keep_only
from tests.fake_tree import fake_tree


def _tree(tmp_path: Path, files: list[str]) -> Path:
    tree = fake_tree(tmp_path / "recipes")
    keep_only(tree, "llm_tiny.yaml")
    f = tree / "llm_tiny.yaml"
    f.write_text(f.read_text().replace("  generate: 8\n", f"  generate: 8\n  tokenizer: {files}\n"))
    (tree / "models" / "tok").mkdir(parents=True, exist_ok=True)
    (tree / "models" / "tok" / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}')
    (tree / "models" / "tok" / "tokenizer_config.json").write_text("{}")
    return tree


def test_tokenizer_files_are_package_inputs_and_outputs(tmp_path: Path) -> None:
    tree = _tree(tmp_path, ["models/tok/tokenizer.json", "models/tok/tokenizer_config.json"])
    plan = make_plan(recipe.load([tree]), tmp_path / "out")
    packages = [a for a in plan.actions if a.kind == "llm_package"]
    assert packages
    for a in packages:
        assert a.inputs["tokenizer:tokenizer.json"] == str(tree / "models" / "tok" / "tokenizer.json")
        out = Path(a.outputs["tokenizer:tokenizer_config.json"])
        assert out.parent == Path(a.outputs["config"]).parent and out.name == "tokenizer_config.json"
    # the genai check copies the shipped copies into cpu_twin/ (so an edit re-runs it too); nothing else reads them
    checks = [a for a in plan.actions if a.kind == "llm_genai"]
    assert len(checks) == len(packages)
    for a in checks:
        package = next(p for p in packages if p.target == a.target)
        assert {k: v for k, v in a.inputs.items() if k.startswith("tokenizer:")} == \
            {k: v for k, v in package.outputs.items() if k.startswith("tokenizer:")}
    others = [a for a in plan.actions if a.kind not in ("llm_package", "llm_genai")]
    assert not any(k.startswith("tokenizer:") for a in others for k in a.inputs)


@pytest.mark.parametrize("files, why", [
    (["models/tok/missing.json"], "tokenizer file 'models/tok/missing.json' not found"),
    (["models/tok/tokenizer.json", "models/tok/tokenizer.json"], "its name clashes with"),
    # copied into OUT and the cache: only from the recipe's or the model's directory, symlinks followed
    (["/etc/hostname"], "tokenizer file '/etc/hostname' is outside the recipe's directory"),
    (["../../secret/credentials"], "is outside the recipe's directory"),
    (["models/tok/escape.json"], "tokenizer file 'models/tok/escape.json' is outside"),
])
def test_bad_tokenizer_entries_name_the_line(tmp_path: Path, files: list[str], why: str) -> None:
    tree = _tree(tmp_path, files)
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "credentials").write_text("password")
    (tree / "models" / "tok" / "escape.json").symlink_to(tmp_path / "secret" / "credentials")
    with pytest.raises(RecipeError) as e:
        recipe.load([tree])
    text = (tree / "llm_tiny.yaml").read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if "tokenizer:" in t)
    assert e.value.message.startswith(f"{tree / 'llm_tiny.yaml'}:{line}: "), e.value.message
    assert why in e.value.message


def test_prompts_dir_outside_the_project_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path, ["models/tok/tokenizer.json"])
    f = tree / "llm_tiny.yaml"
    f.write_text(f.read_text().replace("prompts: {dir: models/prompts/llama_tiny,", "prompts: {dir: /etc,"))
    with pytest.raises(RecipeError) as e:
        recipe.load([tree])
    assert "llm.prompts.dir '/etc' is outside the recipe's directory" in e.value.message
