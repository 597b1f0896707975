"""Quoting for build.ninja and the gcc-style depfiles ninja reads, the way meson's ninjabackend does it.

- A path in a build statement: ninja-escaped (`$` -> `$$`, space -> `$ `, `:` -> `$:`).
- A command: each argument shell-quoted (shlex.quote), THEN ninja-escaped (`$` -> `$$`): ninja expands
  `$` first and hands the result to /bin/sh, which splits and unquotes it (meson's `_quoter`).
- A depfile: `\\ ` for a space, `\\#` for `#`, `$$` for `$` (ninja's depfile_parser).
ninja has no way to write a newline in a path: such a path is refused with one line naming it.
Kept import-light: the action processes write depfiles.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from ctxbuild.errors import UsageError


def check_no_newline(p: str) -> str:
    if "\n" in p or "\r" in p:
        raise UsageError(f"{p!r}: a path with a line break cannot be used (build.ninja and depfiles cannot "
                         "express it)", "rename the file or directory")
    return p


def ninja_path(p: str) -> str:
    """A path in a `build` line (outputs, inputs)."""
    return re.sub(r"([$ :])", r"$\1", check_no_newline(p))


def ninja_value(text: str) -> str:
    """Text in a variable's value (`command =`, `depfile =`): only `$` is special there."""
    return check_no_newline(text).replace("$", "$$")


def ninja_command(args: Iterable[str]) -> str:
    """A command line: shell-quoted per argument, then escaped for ninja."""
    return ninja_value(" ".join(shlex.quote(check_no_newline(a)) for a in args))


# ninja's depfile parser ends a path at these and has no escape for them (measured with ninja 1.13).
_NOT_IN_DEPFILES = re.compile(r"[;*<>|`\t]")


def depfile_path(p: str) -> str:
    """A path in a depfile (gcc syntax as ninja reads it)."""
    if bad := _NOT_IN_DEPFILES.search(p):
        raise UsageError(f"{p}: ninja cannot track a file whose path contains {bad.group()!r}",
                         "rename the file or directory")
    return check_no_newline(p).replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")
