"""The report's drawing of the action graph: left to right, one column per layer (the longest path from a
source), the order within a column by barycenter sweeps; node boxes sized for their monospace labels, edges as
curves. Plain data the template turns into SVG."""
from __future__ import annotations

from typing import Any

from ctxbuild.outputs.lineage import topo_order

# Labels are monospace, so their width is predictable.
_CHAR_W, _NODE_H, _V_GAP, _COL_GAP, _PAD, _MAX_LABEL = 6.7, 26, 10, 56, 12, 52


def layout(actions: list[dict[str, Any]], status: dict[str, str], hrefs: dict[str, str | None]) -> dict[str, Any]:
    """Layered drawing: layer = longest path from a source; order within a layer by the predecessors' mean rank."""
    order = topo_order(actions)
    layer: dict[str, int] = {}
    for a in order:
        layer[a["id"]] = 1 + max((layer[d] for d in a["deps"] if d in layer), default=-1)
    columns: list[list[dict[str, Any]]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for a in order:
        columns[layer[a["id"]]].append(a)
    preds: dict[str, list[str]] = {a["id"]: a["deps"] for a in order}
    users: dict[str, list[str]] = {}
    for a in order:
        for d in a["deps"]:
            users.setdefault(d, []).append(a["id"])
    if columns:
        columns[0].sort(key=lambda a: ((a.get("recipes") or [""])[0], a["id"]))
    rank: dict[str, float] = {}  # vertical centre of a node, in rows, columns centred on each other
    _rank(columns, range(len(columns)), rank)
    for _ in range(2):  # barycenter sweeps (Sugiyama): down by predecessors, then up by successors
        for sweep, near in ((range(1, len(columns)), preds), (range(len(columns) - 2, -1, -1), users)):
            for i in sweep:
                keyed = sorted((_bary(a, near.get(a["id"], []), rank), rank[a["id"]], a["id"]) for a in columns[i])
                by = {a["id"]: a for a in columns[i]}
                columns[i] = [by[k[2]] for k in keyed]
                _rank(columns, [i], rank)
    tallest = max((len(c) for c in columns), default=0)
    height = _PAD * 2 + tallest * (_NODE_H + _V_GAP) - (_V_GAP if tallest else 0)
    nodes, pos, x = [], {}, float(_PAD)
    for col in columns:
        labels = [_label(a) for a in col]
        w = round(max((len(lb) for lb in labels), default=8) * _CHAR_W + 20, 1)
        y0 = (height - (len(col) * (_NODE_H + _V_GAP) - _V_GAP)) / 2
        for j, (a, lb) in enumerate(zip(col, labels)):
            y = round(y0 + j * (_NODE_H + _V_GAP), 1)
            pos[a["id"]] = (x, y, w)
            st = status.get(a["id"], "not built")
            nodes.append({"id": a["id"], "kind": a["kind"], "label": lb, "status": st, "css": _css(st),
                          "layer": layer[a["id"]], "href": hrefs.get(a["id"]), "x": x, "y": y, "w": w,
                          "tx": round(x + 10, 1), "ty": round(y + _NODE_H / 2 + 4, 1),
                          "title": f"{a.get('description') or a['id']}: {st}"})
        x = round(x + w + _COL_GAP, 1)
    edges = []
    for a in order:
        for d in a["deps"]:
            if d in pos:
                x1, y1, w1 = pos[d]
                x2, y2, _ = pos[a["id"]]
                sx, sy, ex, ey = x1 + w1, y1 + _NODE_H / 2, x2, y2 + _NODE_H / 2
                mx = (sx + ex) / 2
                edges.append({"from": d, "to": a["id"], "failed": status.get(d) == "failed",
                              "d": f"M{sx:.1f},{sy:.1f} C{mx:.1f},{sy:.1f} {mx:.1f},{ey:.1f} {ex:.1f},{ey:.1f}"})
    width = round(x - _COL_GAP + _PAD, 1) if columns else 0
    return {"width": width, "height": height, "node_h": _NODE_H, "nodes": nodes, "edges": edges}


def _bary(a: dict[str, Any], neighbours: list[str], rank: dict[str, float]) -> float:
    ps = [rank[n] for n in neighbours if n in rank]
    return sum(ps) / len(ps) if ps else rank[a["id"]]


def _rank(columns: list[list[dict[str, Any]]], which: Any, rank: dict[str, float]) -> None:
    for i in which:
        mid = (len(columns[i]) - 1) / 2
        for j, a in enumerate(columns[i]):
            rank[a["id"]] = j - mid


def _label(a: dict[str, Any]) -> str:
    s = a.get("description") or a["id"]
    return s if len(s) <= _MAX_LABEL else s[: _MAX_LABEL - 1] + "…"


def _css(status: str) -> str:
    return {"built": "built", "cache": "cache", "failed": "failed", "up to date": "uptodate",
            "up to date (cache)": "uptodate", "not built": "notbuilt"}.get(status, "notbuilt")
