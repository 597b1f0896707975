"""Inputs reached through a symlink: a retargeted link makes the actions reading it run again.

ninja follows links when it stats an input, so `current.onnx -> v2.onnx` retargeted to a file with an older
mtime (a rollback, `cp -p`, rsync) looks up to date to it. The plan lists every outside input whose path
passes through a link (`links` in plan.json); before asking ninja what is pending, the driver compares each
one's stamp (the link's own lstat, where it leads, and the target's stat) with the one it saw last and
removes the outputs of the actions that read a changed one. Those actions then run again or restore by
their key, which hashes the content the link leads to now. A plain `ninja` in OUT cannot see this.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ctxbuild.atomic import write_if_changed
from ctxbuild.layout import STATE

_STAMPS = "links.json"


def linked_inputs(actions: list[Any], out: Path) -> dict[str, list[str]]:
    """Outside inputs whose path passes through a symlink -> the ids of the actions reading them."""
    inside = str(out) + os.sep
    links: dict[str, list[str]] = {}
    for a in actions:
        for p in [*a.inputs.values(), *map(str, a.watch)]:
            if not p.startswith(inside) and os.path.realpath(p) != os.path.abspath(p):
                links.setdefault(p, []).append(a.id)
    return {p: sorted(set(ids)) for p, ids in sorted(links.items())}


def stamp(path: str) -> list[Any]:
    """Each link on the way (its lstat), where it leads, and the target's stat (size, mtime, inode, ctime)."""
    parts: list[Any] = []
    here = Path(path)
    for p in [here, *here.parents]:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if os.path.islink(p):
            parts.append([str(p), os.readlink(p), st.st_mtime_ns, st.st_ino, st.st_ctime_ns])
    try:
        st = os.stat(path)
        parts.append([os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns])
    except OSError:
        parts.append(None)
    return parts


def invalidate_retargeted(out: Path, state: dict[str, Any]) -> list[str]:
    """Remove the outputs of actions reading a link input that changed since the last build; returns their ids."""
    links: dict[str, list[str]] = state.get("links", {})
    path = out / STATE / _STAMPS
    try:
        seen = json.loads(path.read_text())
    except (OSError, ValueError):
        seen = {}
    now = {p: stamp(p) for p in links}
    stale = sorted({i for p, ids in links.items() if seen.get(p) != now[p] for i in ids})
    outputs = {a["id"]: a["outputs"] for a in state["actions"]}
    for action_id in stale:
        for o in outputs.get(action_id, []):
            Path(o).unlink(missing_ok=True)
    if links or seen:
        write_if_changed(path, json.dumps(now, sort_keys=True).encode(), durable=False)
    return stale
