"""A fixed path to hand the QNN EP: compile outputs that do not depend on where OUT is.

Given a model *path*, the EP derives the graph (partition) name, and with it bits of the binary, from
that path; a model given as bytes cannot carry external data (weights over 2 GB). So the model and its
external data files are exposed, as links, under a directory named by the digest of those models alone:
the same inputs give byte-identical outputs in any OUT directory (measured, onnxruntime-qnn 2.7.0).
Two processes staging the same models (two OUT dirs, or two actions, building at once) take turns on a lock.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError

# Not $TMPDIR: the path ends up in the binary, so it must be the same on every machine.
ROOT = Path("/tmp")


def stage_name(key_components: dict[str, Any]) -> str:
    """The staging directory's name: a digest of the models handed to the EP (roles `model...`), nothing
    else. Two actions compiling the same model bytes (a plain build and a precision-search candidate, two
    recipes) then see the same path and get the same binary; different models never share a directory."""
    from ctxbuild.digests import canonical_json

    models = {r: d for r, d in key_components["inputs"].items() if r.startswith("model")}
    return hashlib.sha256(canonical_json(models)).hexdigest()


@contextmanager
def fixed_dir(key: str) -> Iterator[Path]:
    """An empty directory /tmp/ctxbuild-stage-<key prefix>, exclusively ours until the block ends."""
    d = ROOT / f"ctxbuild-stage-{key[:24]}"
    with _locked(Path(f"{d}.lock")):
        shutil.rmtree(d, ignore_errors=True)  # a crashed run's leftovers
        d.mkdir()
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """flock on `path`, removed afterwards. A waiter that wakes on a lock file already unlinked by the
    holder sees another inode (or none) at `path` and tries again: the classic race-free pattern."""
    while True:
        try:
            f = open(path, "a")
        except OSError as e:
            raise ActionError(f"cannot lock {path}: {e.strerror}", "remove it, or make /tmp writable") from None
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        f.close()


def link_model(model: Path, into: Path, name: str | None = None) -> Path:
    """Link `model` (as `name`) and the external data files it names into `into`; returns the link."""
    link = into / (name or model.name)
    _link(model.resolve(), link)
    link_data(model, into)
    return link


def link_data(model: Path, into: Path) -> None:
    """Link the external data files `model` names into `into`, under the names the model uses."""
    from ctxbuild.graph.modelio import external_data_files, load

    for role, path in external_data_files(load(model, external_data=False), model).items():
        dst = into / role.removeprefix("external:")
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            _link(path, dst)


def _link(src: Path, dst: Path) -> None:
    """A hardlink (onnx's Python loader refuses symlinked external data), else a symlink (ORT takes it)."""
    try:
        os.link(src, dst)
    except OSError:  # another filesystem
        dst.symlink_to(src)
