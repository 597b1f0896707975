"""OUT is owned: OUT/.ctxbuild/owner.json binds it to the absolute path it was made at and an owner id.

`-o DIR` on a directory of the user's once overwrote its report.html, manifest.json and build.ninja (and `clean`
then deleted them): a directory that is neither empty nor a ctxbuild OUT is refused before anything is written.
A copied or moved OUT once built into the original's paths (its specs, plan and build.ninja name them): before a
build writes anything, a marker naming another place (or an OUT of a ctxbuild before markers) is re-bound here.
The state that names absolute OUT paths is dropped and re-planned; what is relative to OUT (artifacts, records,
depfiles, ninja's log) stays. Action ids do not depend on OUT's place (plan/steps.py), so the re-plan names the same
actions: their specs changed, so ninja runs them again, and each is restored from the cache (or re-run without one).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ctxbuild.atomic import write_bytes
from ctxbuild.errors import UsageError
from ctxbuild.layout import STATE

MARKER = "owner.json"
# What names OUT by its absolute path: re-made by the next plan (build.ninja's regen line, the specs' outputs,
# plan.json's actions and links, the digest memo's keys, the work dirs of killed actions).
BOUND = ("plan.json", "invocation.json", "actions", "digests.sqlite", "tmp")


def marker_path(out: Path) -> Path:
    return out / STATE / MARKER


def read(out: Path) -> dict[str, Any] | None:
    try:
        m = json.loads(marker_path(out).read_bytes())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and isinstance(m.get("out"), str) else None


def is_out(out: Path) -> bool:
    """A ctxbuild OUT: it holds ctxbuild's state directory (with a marker, or from a ctxbuild before markers)."""
    return (out / STATE).is_dir()


def refuse_foreign(out: Path) -> None:
    """Refuse (exit 2, before any write) an existing directory that holds files and is not a ctxbuild OUT."""
    try:
        entries = sorted(e.name for e in os.scandir(out))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise UsageError(f"{out} is a file, not an output directory", "give a directory") from None
    if entries and not is_out(out):
        more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
        raise UsageError(f"output directory {out} is not empty and not a ctxbuild output directory (it holds "
                         f"{entries[0]}{more})", "give a new or empty directory; ctxbuild writes only into its own")


def bound(out: Path) -> bool:
    """OUT's marker names this very place (its plan and specs can be used as they are)."""
    m = read(out)
    return m is not None and m["out"] == str(out.resolve())


def bind(out: Path) -> None:
    """Claim a new or empty OUT, or re-bind one that was moved or copied here (or predates markers): drop the state
    naming another place, then write the marker. Call it holding OUT's lock, before anything else is written."""
    out = out.resolve()
    m = read(out)
    if m is not None and m["out"] == str(out):
        return
    if m is not None or (out / STATE / "plan.json").exists() or (out / "build.ninja").exists():
        was = f"was built as {m['out']}" if m is not None else "has no owner marker (an older ctxbuild's OUT)"
        print(f"ctxbuild: {out} {was}: re-binding it here (re-planning)", file=sys.stderr, flush=True)
        unbind(out)
    write_bytes(marker_path(out), json.dumps({"out": str(out), "id": os.urandom(16).hex()}).encode(), durable=False)


def unbind(out: Path) -> None:
    """Remove the state that names OUT by its absolute path (build.ninja and BOUND)."""
    (out / "build.ninja").unlink(missing_ok=True)
    for name in BOUND:
        p = out / STATE / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def confined(paths: list[str], out: Path) -> str | None:
    """The first of `paths` (an action's outputs) outside OUT, or None: a spec of a moved or copied OUT names the
    original's paths, and an action run from it (plain `ninja` there) must write nothing, and delete nothing."""
    return next((p for p in paths if not Path(p).is_relative_to(out)), None)
