"""A precision search's candidate table with what each candidate cost, for the manifest and the report.

The select action's `<recipe>_search.json` holds what is deterministic (metrics, pass/fail, binary sizes);
the seconds come from the candidates' action records (for a cache restore: what the work cost when it ran).
Import-light (json only): the report is written after every build, no-op builds included.
"""
from __future__ import annotations

from typing import Any, Callable


def search_of(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The search table a select record carries: on success in `search`, on failure in its result details."""
    if not record:
        return None
    return record.get("search") or (record.get("result") or {}).get("search")


def with_costs(search: dict[str, Any], actions: dict[str, dict[str, str]],
               read_record: Callable[[str], dict[str, Any] | None]) -> dict[str, Any]:
    """`actions`: candidate -> {step: action id}, from the plan state (plan/search.candidate_actions)."""
    rows = []
    for c in search.get("candidates", []):
        seconds: dict[str, float | None] = {}
        for step, action_id in actions.get(c["name"], {}).items():
            r = read_record(action_id) or {}
            seconds[step] = r.get("original_seconds") if r.get("source") == "cache" else r.get("seconds")
        known = [s for s in seconds.values() if s is not None]
        rows.append({"name": c["name"], "passed": c["passed"], "winner": c["name"] == search.get("winner"),
                     "outputs": c["outputs"], "bin_size": c["bin_size"], "failures": c.get("failures", []),
                     "compile_refused": c.get("compile_refused"), "note": c.get("note"), "state": c.get("state"),
                     "blamed": c.get("blamed"), "predicted_by": c.get("predicted_by"), "disagrees": c.get("disagrees"),
                     "seconds": seconds, "total_seconds": round(sum(known), 3) if known else None})
    return {"winner": search.get("winner"), "thresholds": search.get("thresholds"), "candidates": rows,
            "skipped": search.get("skipped", []), "pin": search.get("pin")}
