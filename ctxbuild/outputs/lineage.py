"""What an action is made from, from the plan state: its ancestors, and the legalization rewrites among them."""
from __future__ import annotations

from typing import Any, Callable


def ancestors(aid: str, by_id: dict[str, Any]) -> list[str]:
    """Every action `aid` depends on, directly or not, nearest first."""
    seen: dict[str, None] = {}  # ordered set
    todo = list(by_id[aid]["deps"])
    while todo:
        d = todo.pop()
        if d in by_id and d not in seen:
            seen[d] = None
            todo.extend(by_id[d]["deps"])
    return list(seen)


def rewrites(aid: str, by_id: dict[str, Any], record: Callable[[str], dict[str, Any] | None]) -> dict[str, int]:
    """rule -> count of the rewrites prepare made in the model(s) behind `aid` (graph/legalize), from records."""
    found: dict[str, int] = {}
    for dep in ancestors(aid, by_id):
        if by_id[dep]["kind"] == "prepare":
            found.update((record(dep) or {}).get("rewrites") or {})
    return found
