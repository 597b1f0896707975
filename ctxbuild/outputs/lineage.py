"""What an action is made from, from the plan state: its ancestors, the legalization rewrites among them, and
the actions in dependency order."""
from __future__ import annotations

from typing import Any, Callable

from ctxbuild.plan import kinds


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
        if kinds.get(by_id[dep]["kind"]).legalizes:
            found.update((record(dep) or {}).get("rewrites") or {})
    return found


def topo_order(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kahn's algorithm, stable in plan order; a (never expected) cycle's members are appended at the end."""
    by_id = {a["id"]: a for a in actions}
    indeg = {a["id"]: sum(d in by_id for d in a["deps"]) for a in actions}
    users: dict[str, list[str]] = {}
    for a in actions:
        for d in a["deps"]:
            users.setdefault(d, []).append(a["id"])
    order = [a["id"] for a in actions if indeg[a["id"]] == 0]
    for n in order:  # grows while it is walked: a FIFO queue
        for u in users.get(n, []):
            indeg[u] -= 1
            if indeg[u] == 0:
                order.append(u)
    done = set(order)
    return [by_id[i] for i in order] + [a for a in actions if a["id"] not in done]
