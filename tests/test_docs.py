"""The docs keep up with the code: every recipe field of the JSON Schema appears in docs/recipes.md, and the
README stays a front page (what it is, install, quick start, where to go next) under 150 lines."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ctxbuild.recipes.recipe import SCHEMA_PATH

ROOT = Path(__file__).resolve().parent.parent


def _properties(node: Any, path: str = "") -> dict[str, str]:
    """field name -> where in the schema (every `properties` key, at any depth, $defs included)."""
    found: dict[str, str] = {}
    if isinstance(node, dict):
        for name, sub in (node.get("properties") or {}).items():
            found.setdefault(name, f"{path}.{name}".lstrip("."))
            found.update({k: v for k, v in _properties(sub, f"{path}.{name}").items() if k not in found})
        for key, sub in node.items():
            if key != "properties":
                found.update({k: v for k, v in _properties(sub, path).items() if k not in found})
    elif isinstance(node, list):
        for sub in node:
            found.update({k: v for k, v in _properties(sub, path).items() if k not in found})
    return found


def test_every_schema_field_is_documented() -> None:
    doc = (ROOT / "docs" / "recipes.md").read_text()
    fields = _properties(json.loads(SCHEMA_PATH.read_text()))
    assert len(fields) > 40  # the walk found the recipe's fields, not nothing
    missing = [f"{name} ({where})" for name, where in sorted(fields.items())
               if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", doc)]
    assert not missing, f"docs/recipes.md does not mention: {', '.join(missing)}"


def test_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150
    for heading in ("## Install", "## Quick start", "## Where to go next"):
        assert heading in text, heading
    assert not re.search(r"pip install\s+['\"]?ctxbuild", text)  # not on PyPI: never suggest installing it from there
    for link in re.findall(r"\]\(([^)#]+)\)", text):  # every page the front page points at exists
        assert link.startswith("http") or (ROOT / link).exists(), link


def test_every_yaml_block_in_the_docs_is_a_valid_recipe_or_defaults_file() -> None:
    """What a reader copies: each ```yaml block of the README and docs/ (recipes, fragments of one, a _defaults.yaml)
    passes the schema ctxbuild checks recipes with (a renamed or retyped field would fail the reader's build)."""
    import yaml

    from ctxbuild.recipes import recipe

    checked = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S):
            data = yaml.safe_load(block)
            defaults = bool({"defaults", "target_groups", "cache", "executor"} & set(data))
            schema = recipe.schema()["$defs"]["defaults_file"] if defaults else recipe._partial_recipe_schema()
            recipe._validate(page, data, schema)  # raises RecipeError naming the field
            checked += 1
    assert checked >= 15, checked
