"""Reuse a plan for a fresh OUT: CI plans the same recipes into a new OUT every job (~0.3 s of importing
networkx, jsonschema and jinja2, then validating and rendering), although only their content decides it.

An entry in the user cache (plans/<slot>.json) holds what `ninja.render` wrote (build.ninja, plan state,
action specs) and the fingerprint of what the planner read: the content of every recipe and defaults file,
the listing of every directory scanned (a new recipe), and the stat (size, mtime, inode, ctime, and each symlink
on the way) of every file an action reads from outside OUT (missing models; the verification default depends on model size). The slot names everything
else a plan depends on: ctxbuild's own files, the interpreter, the invocation and the OUT path. One entry
per slot, the latest; a plan is stored only after it was made without error.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ctxbuild import settings
from ctxbuild.atomic import write_bytes, write_if_changed
from ctxbuild.engine.fast.links import stamp
from ctxbuild.layout import STATE, memo_dir

VERSION = 3  # 2: QNN libraries by stat; 3: outside inputs by stat and symlinks, not size
KEEP = 32  # entries kept (most recently used): one per OUT path x invocation x ctxbuild version
_PACKAGE = Path(__file__).resolve().parents[2]  # ctxbuild/


def restore(out: Path, inv: dict[str, Any]) -> bool:
    """Write the cached plan for this invocation into OUT if the recipe tree still matches it."""
    if settings.NO_CACHE.get():
        return False
    path = _entry_path(out, inv)
    try:
        entry = json.loads(path.read_bytes())
        if entry.get("version") != VERSION or _fingerprint(out, entry["plan"], entry["specs"]) != entry["fingerprint"]:
            return False
        os.utime(path)  # recently used: kept by _prune
    except (OSError, ValueError, KeyError, TypeError):
        return False
    state = out / STATE
    specs = state / "actions"
    for name, text in entry["specs"].items():
        write_if_changed(specs / name, text.encode(), durable=False)
    for stale in specs.glob("*.json"):
        if stale.name not in entry["specs"]:
            stale.unlink()
    write_if_changed(state / "invocation.json", entry["invocation"].encode(), durable=False)
    write_if_changed(state / "plan.json", entry["plan"].encode(), durable=False)
    if not write_if_changed(out / "build.ninja", entry["build.ninja"].encode(), durable=False):
        os.utime(out / "build.ninja")  # as ninja.render: newer than the generator edge's inputs
    return True


def store(out: Path, inv: dict[str, Any]) -> None:
    """Keep what ninja.render just wrote into OUT for the next fresh OUT of this invocation."""
    if settings.NO_CACHE.get():
        return
    state = out / STATE
    try:
        plan = (state / "plan.json").read_text()
        specs = {p.name: p.read_text() for p in sorted((state / "actions").glob("*.json"))}
        entry = {"version": VERSION, "plan": plan, "specs": specs, "fingerprint": _fingerprint(out, plan, specs),
                 "invocation": (state / "invocation.json").read_text(),
                 "build.ninja": (out / "build.ninja").read_text()}
        path = _entry_path(out, inv)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, json.dumps(entry).encode(), durable=False)
        _prune(path.parent)
    except (OSError, ValueError):  # a read-only or full cache dir: plan every time
        pass


def _prune(directory: Path) -> None:
    """Keep the KEEP most recently used entries (each new ctxbuild version or OUT path adds one)."""
    entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for stale in entries[KEEP:]:
        stale.unlink(missing_ok=True)


def _own_dirs() -> list[Path]:
    from ctxbuild.templating import template_dir

    return [_PACKAGE, template_dir()]


def _entry_path(out: Path, inv: dict[str, Any]) -> Path:
    h = hashlib.sha256(json.dumps([VERSION, sys.executable, str(_PACKAGE), str(out), inv], sort_keys=True).encode())
    for root in _own_dirs():  # ctxbuild's code and schema, its templates
        own = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        for p in sorted(own):
            h.update(str(p.relative_to(root.parent)).encode() + b"\0" + p.read_bytes())
    return memo_dir("plans") / f"{h.hexdigest()}.json"


def _fingerprint(out: Path, plan_text: str, specs: dict[str, str]) -> list[Any]:
    """What the planner read, as it is now: directory listings, recipe and defaults content (a checkout gives
    them new mtimes), the stat of the QNN libraries (hashing them cost ~0.2 s; pip replaces them with new
    files), the stat of outside inputs and of every symlink on their way (size alone misses a retrained model
of the same size; a fresh checkout's new mtimes cost one re-plan). ctxbuild's own files are in the entry's slot."""
    plan = json.loads(plan_text)
    libraries = set(plan["toolchain_deps"])
    read: list[Any] = []
    for p in plan["generator_deps"]:
        if any(Path(p).is_relative_to(d) for d in _own_dirs()):
            continue
        if p in libraries:
            read.append([p, _stat(p)])
        elif os.path.isdir(p):
            read.append([p, sorted(os.listdir(p))])
        else:
            read.append([p, _sha256(p)])
    outside = set()
    for text in specs.values():
        spec = json.loads(text)
        outside.update(spec["inputs"].values())
        outside.update(spec["watch"])
    inside = str(out) + os.sep  # outputs of other actions: not there yet in a fresh OUT
    return [read, [[p, stamp(p)] for p in sorted(outside) if not p.startswith(inside)]]


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]
