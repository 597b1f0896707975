"""The toolchains a build's plan uses: provisioned before anything is keyed, and a toolchain that changed
since the last build in this OUT re-runs the actions that used it."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ctxbuild.atomic import write_bytes
from ctxbuild.engine import ninja
from ctxbuild.layout import STATE, spec_name
from ctxbuild.plan import actionkey
from ctxbuild.toolchain import installed as toolchain


def used(state: dict[str, Any]) -> list[str]:
    """The provisioned toolchains the plan's actions run in (not the installed one)."""
    return sorted({a["toolchain"] for a in state["actions"] if a.get("toolchain")})


def ensure_provisioned(state: dict[str, Any], say: Any, live: Any = None) -> None:
    """Every toolchain the plan uses, provisioned before anything is keyed (a no-op reads one JSON each); `say`
    and `live` as provision.ensure takes them."""
    from ctxbuild.toolchain import choose, provision

    for name in used(state):
        provision.ensure(choose.by_name(name), say, live=live)


def note_changes(out: Path, state: dict[str, Any]) -> None:
    """ninja cannot see a toolchain upgrade (same command, same input files), so when an action kind's
    toolchain fingerprint differs from the last build's in this OUT, touch those actions' spec files (an
    input of every edge): ninja re-runs them and each re-keys (a cache hit if that toolchain built it before).
    Kinds are told apart per toolchain (`compile@onnxruntime-qnn-2.3.0`)."""
    def slot(a: dict[str, Any]) -> str:
        return a["kind"] + (f"@{a['toolchain']}" if a.get("toolchain") else "")

    kinds = sorted({slot(a) for a in state["actions"]})
    # a no-op build stops here: fingerprints need importlib.metadata
    stamp = [actionkey.ACTION_SCHEMA_VERSION, toolchain.quick_stamp(tuple(used(state)))]
    seen = ninja.read_state(out, "toolchain_seen.json") or {}
    before = seen.get("kinds")
    if seen.get("stamp") == stamp and before is not None and set(kinds) <= set(before):
        return
    now = {k: actionkey.fingerprint(k.partition("@")[0], out / STATE, k.partition("@")[2] or None) for k in kinds}
    if before is not None:
        changed = {k for k in kinds if k in before and before[k] != now[k]}
        for a in state["actions"]:
            if slot(a) in changed:
                try:
                    os.utime(out / STATE / "actions" / spec_name(a["id"]))
                except OSError:
                    pass
    write_bytes(out / STATE / "toolchain_seen.json", json.dumps({"stamp": stamp, "kinds": now}, sort_keys=True).encode(),
                durable=False)
