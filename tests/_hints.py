"""Helpers for tests of a failing build's one-line hint: the FAILED line it printed, and the recipe line the hint
gives to paste (the user's next step, which those tests then build)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def failed_line(ctxbuild: Any, recipe: Path, out: Path, action: str) -> str:
    """Build `recipe` into `out`, which fails (exit 1): its one `ctxbuild: FAILED <action>...` line."""
    r = ctxbuild("build", str(recipe), "-o", str(out))
    assert r.code == 1, r.text
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith(f"ctxbuild: FAILED {action}")]
    return line


def pasted(line: str, field: str) -> str:
    """The `<field>: ...` recipe line a hint gives in backquotes, as the user pastes it."""
    found = re.search(rf"`({field}: [^`]*)`", line)
    assert found, line
    return found[1]


def build_pasted(ctxbuild: Any, recipe: Path, text: str, out: Path, target: str = "SM8650") -> tuple[Any, dict[str, Any]]:
    """`recipe` rewritten as `text` (with a hint's line pasted) and built into `out`, which passes: its wrapper (the
    proto, no weights) on `target` and its verification result."""
    import onnx

    recipe.write_text(text)
    r = ctxbuild("build", str(recipe), "-o", str(out))
    assert r.code == 0, r.text
    where = out / target / recipe.stem
    return (onnx.load(str(where / f"{recipe.stem}_ctx.onnx"), load_external_data=False),
            json.loads((where / f"{recipe.stem}_verify.json").read_text()))
