"""Node names across prepare's rewrites: which nodes of the prepared model each node of the user's model became.

quantization.nodes and the diagnosis speak the names of the user's model (what Netron shows for the model the
recipe names), but prepare removes nodes and adds others: onnxruntime's folding, and legalization (a T5-style
RMSNorm's six or seven nodes become one SimplifiedLayerNormalization named after its ReduceMean). prepare records
the difference in the prepared model's metadata (KEY): each user node whose name the prepared model lacks, with
the prepared nodes that took its place ([] when it was folded into constants), and each added node with the user
nodes it replaced. `Names` reads it both ways.

What took a removed node's place: removed and added nodes are grouped where they are connected: one's output is
another's input within either model, or a tensor (a kept consumer's input slot, a graph output) is computed by one
in the user's model and by the other in the prepared one. A removed node maps to the prepared nodes of its group
(a kept node a fusion grew, Conv for its folded BatchNorm, among them)."""
from __future__ import annotations

import difflib
import json
from typing import Any, NamedTuple, Sequence

KEY = "ctxbuild.renamed"


class Outline(NamedTuple):
    """A node's name and wiring: what `renamed` reads (a Constant's tensor need not be held)."""

    name: str
    input: list[str]
    output: list[str]


def outline(model: Any) -> list[Outline]:
    return [Outline(n.name, list(n.input), list(n.output)) for n in model.graph.node]


def renamed(unodes: Sequence[Any], pnodes: Sequence[Any]) -> dict[str, dict[str, list[str]]]:
    """{"became": {user node: [prepared nodes]}, "from": {added prepared node: [user nodes]}} for the nodes whose
    names differ between the user's model (`unodes`, in order) and the prepared one (`pnodes`); {} when every
    user node kept its name."""
    pnames = {n.name for n in pnodes if n.name}
    unames = {n.name for n in unodes if n.name}
    removed = {i for i, n in enumerate(unodes) if n.name not in pnames}
    added = {i for i, n in enumerate(pnodes) if n.name not in unames}
    if not removed:
        return {}
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(k: tuple[str, int]) -> tuple[str, int]:
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def union(a: tuple[str, int], b: tuple[str, int]) -> None:
        parent[find(a)] = find(b)

    uprod = {o: i for i, n in enumerate(unodes) for o in n.output if o}
    pprod = {o: i for i, n in enumerate(pnodes) for o in n.output if o}
    for side, nodes, changed, prod in (("u", unodes, removed, uprod), ("p", pnodes, added, pprod)):
        for i in changed:  # within one model: a changed node reading what another changed node computes
            find((side, i))
            for t in nodes[i].input:
                if prod.get(t) in changed:
                    union((side, i), (side, prod[t]))
    for t, i in uprod.items():  # a tensor both compute, by nodes of different names
        if t in pprod and unodes[i].name != pnodes[pprod[t]].name:
            union(("u", i), ("p", pprod[t]))
    by_name = {n.name: n for n in pnodes if n.name}
    for n in unodes:  # a kept node's input slot now read from another node
        kept = by_name.get(n.name) if n.name else None
        for old, new in zip(n.input, kept.input if kept is not None else []):
            if old != new and old in uprod and new in pprod and unodes[uprod[old]].name != pnodes[pprod[new]].name:
                union(("u", uprod[old]), ("p", pprod[new]))
    members: dict[tuple[str, int], dict[str, list[str]]] = {}
    for side, nodes in (("u", unodes), ("p", pnodes)):
        for i, n in enumerate(nodes):
            if (side, i) in parent and n.name:
                members.setdefault(find((side, i)), {"u": [], "p": []})[side].append(n.name)
    became = {unodes[i].name: members[find(("u", i))]["p"] for i in sorted(removed) if unodes[i].name}
    origin = {pnodes[i].name: [u for u in members[find(("p", i))]["u"] if u not in pnames]
              for i in sorted(added) if pnodes[i].name and ("p", i) in parent}
    return {"became": became, "from": {p: u for p, u in origin.items() if u}}


class Names:
    """A prepared model's node names, and the user's names prepare recorded for what it rewrote (KEY)."""

    def __init__(self, model: Any) -> None:
        self.nodes = [n.name for n in model.graph.node if n.name]
        props = {p.key: p.value for p in model.metadata_props}
        record = json.loads(props.get(KEY, "{}"))
        self.became: dict[str, list[str]] = record.get("became", {})
        self.origin: dict[str, list[str]] = record.get("from", {})
        self._have = set(self.nodes)

    def resolve(self, name: str) -> list[str] | None:
        """The prepared nodes a name stands for: itself (a user's node prepare kept, or one of its own), what prepare
        made of a user's node ([]: folded into constants), or None when neither model has it."""
        if name in self._have:
            return [name]
        return self.became.get(name)

    def user(self, name: str) -> str:
        """The user's name for a prepared node: its own, or for a node prepare added, the user node it replaced (the
        one whose name it carries, else the last of them: the one computing the replaced group's output)."""
        users = self.origin.get(name)
        if not users:
            return name
        return max((u for u in users if name.startswith(u)), key=len, default=users[-1])

    def close(self, name: str) -> str | None:
        """The user's node name closest to `name` (a typo's fix), else a prepared one's, else None."""
        users = [n for n in self.nodes if n not in self.origin] + list(self.became)
        found = difflib.get_close_matches(name, users, n=1) or difflib.get_close_matches(name, list(self.origin), n=1)
        return found[0] if found else None
