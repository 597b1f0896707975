"""OUT/manifest.json: every artifact with its recipe, target, kind, path, sha256, size and the toolchain."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .atomic import write_if_changed
from .digests import DigestMemo
from .layout import STATE, record_path

MANIFEST_VERSION = 1
KINDS = {"ctx": "epcontext_model", "bin": "context_binary"}


def write(out: Path, plan_state: dict[str, Any], toolchain_versions: dict[str, str]) -> dict[str, Any]:
    """Describe what is on disk and up to date; artifacts of failed or unbuilt actions are left out."""
    memo = DigestMemo(out / STATE / "digests.sqlite")
    artifacts = []
    for art in plan_state["artifacts"]:
        path = out / art["path"]
        record = _read(record_path(out, art["action"]))
        if not path.is_file() or record is None or record.get("status") != "ok":
            continue
        artifacts.append({
            "recipe": art["recipe"], "target": art["target"], "kind": KINDS.get(art["role"], art["role"]),
            "path": art["path"], "sha256": memo.digest(path), "size": path.stat().st_size,
            "graphs": art["graphs"],
        })
    memo.close()
    manifest = {"version": MANIFEST_VERSION, "toolchain": toolchain_versions, "artifacts": artifacts}
    write_if_changed(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    return manifest


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_records(out: Path) -> dict[str, dict[str, Any]]:
    records = {}
    for p in (out / STATE / "records").glob("*.json"):
        try:
            r = json.loads(p.read_text())
            records[r["id"]] = r
        except (OSError, ValueError, KeyError):
            continue
    return records

