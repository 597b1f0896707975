"""Node names across prepare's rewrites: which nodes of the prepared model each node of the user's model became.

quantization.nodes and the diagnosis speak the names of the user's model (what Netron shows for the model the
recipe names), but prepare removes nodes and adds others: onnxruntime's folding, and legalization (a T5-style
RMSNorm's six or seven nodes become one SimplifiedLayerNormalization named after its ReduceMean). prepare records
the difference in the prepared model's metadata (KEY): each user node whose name the prepared model lacks, with
the prepared nodes that took its place ([] when it was folded into constants), and each added node with the user
nodes it replaced. `Names` reads it both ways.

What took a removed node's place is decided step by step (onnxruntime's optimizer, then each legalization rule,
then the optimizer again), each step's map composed with the ones before: a removed node's value flows, through
other removed nodes, to the input slots of nodes the step kept; the added nodes computing what those slots read
now, with the added nodes they read, took its place. A tensor both models compute by nodes of different names ties
them directly (a graph output, which keeps its name; a BatchNorm's output, which its Conv writes once folded).
Step by step, one rule's rewrite is not blamed for its neighbour's: a T5 RMSNorm followed by a dynamic-int8
MatMul maps to the fused op, not to the MatMul too."""
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


def renamed(steps: Sequence[Sequence[Any]]) -> dict[str, dict[str, list[str]]]:
    """{"became": {user node: [prepared nodes]}, "from": {added prepared node: [user nodes]}} over prepare's steps:
    the node outlines of the user's model first, each step's after it, the prepared model's last; {} when every
    user node kept its name."""
    user, final = steps[0], steps[-1]
    current = {n.name: [n.name] for n in user if n.name}
    for before, after in zip(steps, steps[1:]):
        if step := _step(before, after):
            current = {u: list(dict.fromkeys(x for n in now for x in step.get(n, [n]))) for u, now in current.items()}
    order = {n.name: i for i, n in enumerate(final)}
    kept = {n.name for n in user} & set(order)
    became = {u: sorted(now, key=order.__getitem__) for u, now in current.items() if u not in kept}
    if not became:
        return {}
    origin: dict[str, list[str]] = {}
    for u, now in became.items():
        for p in now:
            if p not in kept:
                origin.setdefault(p, []).append(u)
    return {"became": became, "from": origin}


def _step(before: Sequence[Any], after: Sequence[Any]) -> dict[str, list[str]]:
    """One step's map: each node of `before` that `after` lacks -> the nodes of `after` that took its place."""
    by_name = {n.name: n for n in after if n.name}
    producer = {o: n for n in after for o in n.output if o}

    def now(n: Any) -> Any | None:
        """`n` in `after`: by its name, an unnamed node by the tensor it computes (still computed by an unnamed one)."""
        if n.name:
            return by_name.get(n.name)
        p = producer.get(n.output[0]) if n.output else None
        return p if p is not None and not p.name else None

    gone = [now(n) is None for n in before]
    if not any(gone[i] and n.name for i, n in enumerate(before)):
        return {}
    old = {n.name for n in before if n.name}
    added = {n.name for n in after if n.name and n.name not in old}
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(before):
        for t in n.input:
            readers.setdefault(t, []).append(i)

    def upstream(p: Any) -> list[str]:
        """`p` and the added nodes it reads, through added nodes only."""
        seen: dict[str, None] = {}
        todo = [p]
        while todo:
            n = todo.pop()
            if n.name not in seen:
                seen[n.name] = None
                todo += [producer[t] for t in n.input if t in producer and producer[t].name in added]
        return list(seen)

    took: dict[int, list[str]] = {}
    for i in reversed(range(len(before))):  # topological order, reversed: a removed node's removed readers first
        if not gone[i]:
            continue
        found: list[str] = []
        for t in before[i].output:
            p = producer.get(t)
            if p is not None and p.name != before[i].name:  # the same tensor, computed by another node now
                found += upstream(p) if p.name in added else [p.name]
                continue
            for k in readers.get(t, []):
                if gone[k]:  # removed too: its value flows on through it
                    found += took.get(k, [])
                    continue
                reads = list(now(before[k]).input)
                for slot in (j for j, x in enumerate(before[k].input) if x == t):  # what a kept reader reads now
                    p = producer.get(reads[slot]) if slot < len(reads) else None
                    if p is not None and p.name in added:
                        found += upstream(p)
        took[i] = list(dict.fromkeys(n for n in found if n))
    return {before[i].name: names for i, names in took.items() if before[i].name}


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
