"""The manifest's `adapters` list: every LoRA adapter per target, with its files, what it binds and its
verification. Built from plan.json's "adapters" rows (plan_adapters.adapter_rows) and the action records."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ctxbuild.digests import DigestMemo
from ctxbuild.atomic import read_json
from ctxbuild.layout import record_path

# Why a LoRAv2 section has no verification (measured here; see docs/bundles-and-lora.md).
SECTION_UNVERIFIED = ("the x86 HTP simulator refuses context binaries with updateable tensors (QNN error 5005); "
                      "verify on a device")


def adapter_entries(out: Path, rows: list[dict[str, Any]], memo: DigestMemo,
                    verification: Callable[[Path, list[str]], dict[str, Any] | None]) -> list[dict[str, Any]]:
    entries = []
    for row in rows:
        record = read_json(record_path(out, row["action"]))
        paths = [Path(p) for p in row["files"]]
        if record is None or record.get("status") != "ok" or not all(p.is_file() for p in paths):
            continue  # failed or not built: nothing to ship
        entry: dict[str, Any] = {
            "recipe": row["recipe"], "target": row["target"], "name": row["name"], "kind": row["kind"],
            "files": [{"path": str(p.relative_to(out)), "sha256": memo.digest(p), "size": p.stat().st_size}
                      for p in paths],
        }
        if row["kind"] == "onnx_adapter":
            info = record.get("adapter", {})
            entry["binds"] = {"graph": row["graph"], "slots": info.get("slots")}
            entry["verification"] = verification(out, row["verified_by"])
        else:
            keys = row.get("sections") or [row["name"]]
            entry["binds"] = {"graphs": record.get("sections", {}).get(keys[0], {}).get("graphs")}
            if len(keys) > 1:  # grouped LoRA: qnn.lora_config takes one section per run, these in this order
                entry["apply_in_order"] = [str(Path(p).relative_to(out)) for p in paths[len(keys):]]
            entry["verification"] = {"status": "not run", "reason": SECTION_UNVERIFIED}
        entries.append(entry)
    return entries



def alpha_summary(alpha_map: dict[str, Any]) -> dict[str, Any]:
    """An alpha-switched wrapper's map as the manifest and `inspect` show it: the input, the values for off and on,
    and per index the adapter's name, rank, scale and the nodes it adapts."""
    return {"input": alpha_map["input"], "codes": alpha_map.get("codes"),
            "adapters": [{"index": a["index"], "name": a["name"], "rank": a["rank"], "scale": a["scale"],
                          "targets": [t["node"] for t in a["targets"]]} for a in alpha_map["adapters"]]}
