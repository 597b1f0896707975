"""Outputs edited in OUT since their action placed them: removed before ninja runs, so they are put back.

ninja sees an edited output as newer than its inputs, hence up to date, and the manifest would list the
edited bytes. Every placed output's stat is in the digest memo (the runner remembers what it wrote); an
output whose stat moved since is hashed, and if its digest is not the one its record names it is removed:
ninja then runs its edge, which restores the action's bytes from the cache (or builds them).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.digests import DigestMemo, stamp_of
from ctxbuild.layout import STATE, record_path


def remove_edited_outputs(out: Path, state: dict[str, Any]) -> list[str]:
    """Remove outputs whose content is no longer what their action's record says; returns those actions' ids."""
    memo = DigestMemo(out / STATE / "digests.sqlite")
    edited = []
    try:
        known = memo.stamps()  # outputs live under the resolved OUT: their paths are the memo's keys
        for a in state["actions"]:
            moved = [Path(p) for p in a["outputs"] if known.get(p, "") != stamp_of(Path(p))]
            if moved and _remove_if_edited(out, a["id"], moved, memo):
                edited.append(a["id"])
    finally:
        memo.close()
    return edited


def _remove_if_edited(out: Path, action_id: str, moved: list[Path], memo: DigestMemo) -> bool:
    try:
        record = json.loads(record_path(out, action_id).read_text())
        made = {out / o["path"]: o["sha256"] for o in record["outputs"].values()} if record["status"] == "ok" else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        made = {}
    edited = False
    for p in moved:
        if not p.is_file():
            continue  # missing: ninja runs the edge anyway
        if made.get(p) == memo.digest(p):
            memo.remember(p, made[p])  # touched, not edited
            continue
        p.unlink()
        edited = True
    return edited
