"""OUT's safety: where it may be, one build at a time, and a `clean` that removes only what ctxbuild wrote.

`clean -o .` once deleted recipes and models, and `build -o <recipes dir>` was accepted: OUT may not be nor
contain a directory holding recipes, models or samples. It may sit inside one, as meson's build directory may
sit in the source tree (`ctxbuild build x.yaml` with the default `-o out`): recipe discovery skips it (any
directory holding OUT's state dir) and `clean` removes only what ctxbuild wrote.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ctxbuild.errors import UsageError
from ctxbuild.engine.owner import MARKER
from ctxbuild.layout import OUT_FILES, STATE

if TYPE_CHECKING:
    from ctxbuild.recipes.objects import RecipeSet

LOCK = "lock"
WRITTEN = OUT_FILES  # besides the artifacts and OUT/.ctxbuild
_HINT = ("give an output directory of its own: a new subdirectory (of the recipe directory too) or one "
         "elsewhere; it may not be a recipe, model or sample directory nor contain one")


def check_placement(out: Path, dirs: Iterable[Path], what: str) -> None:
    """Refuse an OUT that is or contains one of `dirs` (a usage error, before any write). Inside one is fine."""
    out = out.resolve()
    for d in sorted({Path(d).resolve() for d in dirs}):
        if out == d:
            relation = "is"
        elif d.is_relative_to(out):
            relation = "contains"
        else:
            continue
        raise UsageError(f"output directory {out} {relation} the {what} {d}", _HINT)


def recipe_dirs(paths: Iterable[Path]) -> list[Path]:
    """The directories PATHS name: a directory itself, a recipe file's parent."""
    return [p if p.is_dir() else p.parent for p in paths]


@contextmanager
def locked(out: Path, *, wait: bool = True) -> Iterator[None]:
    """An exclusive flock on OUT/.ctxbuild/lock for the whole build: a second build into the same OUT
    waits (saying so) or, with wait=False, fails with a clear line. The kernel drops it if we die."""
    state = out / STATE
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            if not wait:
                raise UsageError(f"another ctxbuild (pid {holder}) is building into {out}",
                                 "wait for it to finish") from None
            print(f"ctxbuild: waiting for another build into {out} (pid {holder}) to finish", file=sys.stderr,
                  flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.pwrite(fd, f"{os.getpid():<12}".encode(), 0)  # fixed width, no truncate: no new block on a full disk
        yield
    finally:
        os.close(fd)


def clean(out: Path) -> bool:
    """Remove what ctxbuild wrote into OUT, by its ledger: the artifacts its records and plan name, its state, and
    manifest, reports and build.ninja (an owned OUT was empty when ctxbuild claimed it, engine/owner.py), and the
    directories left empty by that; anything else in OUT stays. False if there was nothing to clean: no OUT, or
    a directory without ctxbuild's state (cleaned before, or never an OUT: a build.ninja, manifest.json or
    report.html of the user's own is not ours), where nothing is known to be ours."""
    if not (out / STATE).is_dir():
        return False
    out = out.resolve()
    with locked(out, wait=False):
        ours = (out / STATE / "plan.json").is_file() or (out / STATE / MARKER).is_file()
        files = {out / name for name in WRITTEN if ours} | {out / p for p in _artifacts(out)}
        for f in sorted(files):
            if f.is_relative_to(out / STATE) or not f.is_relative_to(out) or not (f.is_file() or f.is_symlink()):
                continue
            f.unlink()
            d = f.parent
            while d != out and d.is_dir() and not any(d.iterdir()):
                d.rmdir()
                d = d.parent
        shutil.rmtree(out / STATE, ignore_errors=True)
    if not any(out.iterdir()):
        out.rmdir()
    return True


def _artifacts(out: Path) -> set[str]:
    """Output paths (relative to OUT) from the plan and from every action record."""
    paths: set[str] = set()
    try:
        plan = json.loads((out / STATE / "plan.json").read_text())
        for a in plan.get("actions", []):
            paths.update(os.path.relpath(p, out) for p in a.get("outputs", []))
    except (OSError, ValueError, TypeError):
        pass
    for rec in (out / STATE / "records").glob("*.json"):
        try:
            paths.update(o["path"] for o in (json.loads(rec.read_text()).get("outputs") or {}).values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return {p for p in paths if not p.startswith("..") and not os.path.isabs(p)}


def source_dirs(recipes: RecipeSet) -> list[Path]:
    """Every directory the recipes read from: recipe trees, models, samples, prebuilt binaries."""
    dirs = [*recipes.dirs, *(f.parent for f in recipes.files)]
    for r in recipes.recipes:
        dirs += [g.model.parent for g in r.graphs]
        dirs += [g.calibration.dir for g in r.graphs if g.calibration is not None and g.calibration.dir is not None]
        if r.verify.get("dir"):
            dirs.append(r.file.parent / r.verify["dir"])
        if r.prebuilt is not None:
            dirs.append(r.prebuilt.bin.parent)
    return dirs
