"""Paths a recipe names: absolute, symlinks kept, so each build follows the link to what it names now."""
from __future__ import annotations

import os
from pathlib import Path


def named_path(recipe_dir: Path, given: str) -> Path:
    """`given` (relative to the recipe's directory, or absolute) as an absolute path, `..` folded lexically and
    symlinks left in place. Resolving here would bake today's link target into the plan: a retargeted
    `current.onnx -> v2.onnx` would then go unnoticed (the action's key hashes what the link points to at
    run time)."""
    return Path(os.path.abspath(recipe_dir / given))


def outside(path: Path, *roots: Path) -> bool:
    """Whether `path`, its symlinks followed, lies outside every one of `roots` (theirs followed too). For files
    a build copies into OUT and the cache: a recipe must not carry `/etc/...` or `../../secrets` there."""
    real = Path(os.path.realpath(path))
    return not any(real.is_relative_to(os.path.realpath(r)) for r in roots)
