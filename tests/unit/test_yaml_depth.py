"""Deeply nested YAML is refused with one line, like an alias bomb (issue 19, item 10): 400 levels gave a
RecursionError traceback, 100,000 a segfault. Checked with libyaml's CSafeLoader (what ctxbuild uses when
PyYAML has it) and with the pure-Python SafeLoader."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PROBE = """
import json, sys
import yaml
if sys.argv[1] == "pure":
    del yaml.CSafeLoader  # what an install without libyaml has
from ctxbuild.errors import RecipeError
from ctxbuild.recipes import yamlsrc
assert yamlsrc.PARSER == ("python" if sys.argv[1] == "pure" else "libyaml")
try:
    yamlsrc.load_mapping(__import__("pathlib").Path(sys.argv[2]))
    print(json.dumps({"ok": True}))
except RecipeError as e:
    print(json.dumps({"error": str(e)}))
"""


def _bodies() -> dict[str, str]:
    block = "".join(f"{'  ' * i}k{i}:\n" for i in range(400)) + f"{'  ' * 400}leaf: 1\n"
    aliases = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [{'[' * 40}*a{i - 1}{']' * 40}]\n" for i in range(1, 30))
    return {
        "block-400": "model: m.onnx\n" + block,
        "flow-400": "model: m.onnx\nx: " + "[" * 400 + "]" * 400 + "\n",
        "flow-100000": "model: m.onnx\nx: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "aliases": "model: m.onnx\n" + aliases,
    }


@pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False), reason="PyYAML built without libyaml")
@pytest.mark.parametrize("loader", ["libyaml", "pure"])
@pytest.mark.parametrize("name", list(_bodies()))
def test_deep_nesting_is_one_line(tmp_path: Path, loader: str, name: str) -> None:
    f = tmp_path / f"{name}.yaml"
    f.write_text(_bodies()[name])
    p = subprocess.run([sys.executable, "-c", PROBE, loader, str(f)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    result = json.loads(p.stdout)
    assert "nested more than 64 levels deep" in result.get("error", ""), result
    assert result["error"].startswith(f"{f}:") and result["error"].count(str(f)) == 1, result  # the path once


def test_ordinary_nesting_still_loads(tmp_path: Path) -> None:
    from ctxbuild.recipes.yamlsrc import load_mapping

    f = tmp_path / "ok.yaml"
    f.write_text("model: m.onnx\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(60)) + f"{'  ' * 60}leaf: 1\n")
    assert load_mapping(f)["model"] == "m.onnx"
