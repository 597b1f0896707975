"""Reading an action's input: the one check, made when the action reads it, not only when the plan was made.

An `llm.tokenizer` symlink inside the project, retargeted after a first build at any file on the machine, was copied
into OUT and the cache by the next build of the same OUT: its confinement was checked only when a plan was made.
Every input an action keys (and so reads) goes through `checked`: it follows the links as they are now, refuses a
file outside the directories the plan confined it to, and anything but a regular file (a FIFO would block the
digest forever, a device would never end), before its digest is taken and recorded in the action's key.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from ctxbuild.errors import RecipeError

HINT = ("what a build reads into OUT and the cache must come from the project: keep it beside the recipe or the model "
        "(a symbolic link may point only there)")


def roots_for(confine: Mapping[str, Sequence[str]], role: str) -> Sequence[str]:
    """The directories input `role` must resolve into: `confine` maps a role, or a role prefix ending in ':'."""
    return confine.get(role) or next((r for p, r in confine.items() if p.endswith(":") and role.startswith(p)), ())


def checked(path: Path, roots: Sequence[str] = ()) -> Path:
    """`path` as it resolves now, if it lies inside one of `roots` (any place when none) and is a regular file."""
    real = Path(os.path.realpath(path))
    if roots and not any(real.is_relative_to(os.path.realpath(r)) for r in roots):
        shown = f"{path} (now {real})" if real != Path(path) else str(path)
        raise RecipeError(f"{shown} is outside {' and '.join(map(str, roots))}, where the recipe's files must be", HINT)
    mode = os.stat(real).st_mode  # a missing file: FileNotFoundError, as before (the runner names it)
    if not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
        raise RecipeError(f"{path} is {what}, not a file", "give a regular file")
    return real
