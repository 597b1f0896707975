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
MatMul maps to the fused op, not to the MatMul too.

A node the user's model leaves unnamed (exporters often do) goes by its first output tensor (key()): the diagnosis
prints that, quantization.nodes takes it, and it is followed through the steps by that tensor (still computed by
an unnamed node of its op, else removed). Tensors, for quantization.tensors: a removed activation that a node the
step kept reads as one tensor now (an Identity removed, a fused group's output) is carried by that tensor; any
other removed tensor (a BatchNorm folded into its Conv's weights, a Conv's output the BatchNorm after it replaced)
is folded, with the tensors computed from it in its place."""
from __future__ import annotations

import difflib
import json
import re
from typing import Any, NamedTuple, Sequence

KEY = "ctxbuild.renamed"


class Outline(NamedTuple):
    """A node's name and wiring: what `renamed` reads (a Constant's tensor need not be held)."""

    name: str
    op_type: str
    input: list[str]
    output: list[str]


def outline(model: Any) -> list[Outline]:
    return [Outline(n.name, n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


def key(node: Any) -> str:
    """How a node is named to the user: its name, or for a node its model leaves unnamed (exporters often do), its
    first output tensor's (what the diagnosis prints for it and quantization.nodes accepts)."""
    return node.name or (node.output[0] if node.output else "")


def renamed(steps: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """{"became": {user node: [prepared nodes]}, "from": {added prepared node: [user nodes]}, "tensors": {user
    tensor: the prepared tensor carrying its value}, "folded": {user tensor: [prepared tensors computed from it in
    its place]}, "tensor_from": {prepared tensor the user's model lacks: the user tensor whose value it carries},
    "qdq": [the user's own QuantizeLinear/DequantizeLinear nodes]} over prepare's steps: the node outlines of the user's model first, each step's after it, the
    prepared model's last; nodes by key() (an unnamed one by its first output); only what prepare changed, {} when
    nothing was."""
    user, final = steps[0], steps[-1]
    current = {k: [k] for n in user if (k := key(n))}
    tensors: dict[str, tuple[bool, list[str]]] = {t: (True, [t]) for t in _tensors(user)}  # (carried, where)
    for before, after in zip(steps, steps[1:]):
        step, moved = _step(before, after)
        if step:
            current = {u: list(dict.fromkeys(x for n in now for x in step.get(n, [n]))) for u, now in current.items()}
        if moved:
            tensors = {t: _moved(carried, where, moved) for t, (carried, where) in tensors.items()}
    order = {key(n): i for i, n in enumerate(final)}
    kept = set(current) & set(order)
    became = {u: sorted(now, key=order.__getitem__) for u, now in current.items() if u not in kept}
    origin: dict[str, list[str]] = {}
    for u, now in became.items():
        for p in now:
            if p not in kept:
                origin.setdefault(p, []).append(u)
    writes = {key(n): set(n.output) for n in (*user, *final)}
    for p, users in origin.items():  # the one computing what the added node computes last: Names.user's default
        users.sort(key=lambda u: bool(writes.get(u, set()) & writes.get(p, set())))
    record: dict[str, Any] = {}
    if became:
        record.update(became=became, **{"from": origin})
    if carried := {t: where[0] for t, (c, where) in tensors.items() if c and where != [t]}:
        record["tensors"] = carried
    if folded := {t: where for t, (c, where) in tensors.items() if not c}:
        record["folded"] = folded
    mine = set(_tensors(user))
    if made := {where: t for t, where in carried.items() if where not in mine}:
        record["tensor_from"] = made  # the way back: what the diagnosis and QNN's refusal name these by
    if own := sorted(k for n in user if n.op_type in ("QuantizeLinear", "DequantizeLinear") and (k := key(n))):
        record["qdq"] = own  # an already-quantized export's: named as the export has them, not as a quantizer's
    return record


def _extends(name: str, base: str, separators: str) -> bool:
    """Whether `name` is `base` followed by one of `separators` and more."""
    return name.startswith(base) and name[len(base):len(base) + 1] in tuple(separators)


def _tensors(nodes: Sequence[Any]) -> list[str]:
    """The tensors the nodes read and write, each once, in order."""
    return list(dict.fromkeys(t for n in nodes for t in (*n.input, *n.output) if t))


def _moved(carried: bool, where: list[str], moved: dict[str, tuple[bool, list[str]]]) -> tuple[bool, list[str]]:
    """A user tensor's (carried, where) after one more step's `moved`."""
    if carried and where[0] in moved:
        return moved[where[0]]
    return carried, list(dict.fromkeys(x for w in where for x in moved.get(w, (True, [w]))[1]))


def _step(before: Sequence[Any], after: Sequence[Any]) -> tuple[dict[str, list[str]], dict[str, tuple[bool, list[str]]]]:
    """One step's maps: each node of `before` that `after` lacks -> the nodes of `after` that took its place (by
    key()); each tensor of `before` that `after` lacks -> (True, [the tensor carrying its value]) or (False, [the
    tensors computed from it in its place]; [] when nothing is)."""
    before, after = list(before), list(after)  # one object per node: nodes are told apart by id()
    by_name = {n.name: n for n in after if n.name}
    producer = {o: n for n in after for o in n.output if o}

    def now(n: Any) -> Any | None:
        """`n` in `after`: by its name, an unnamed node by the tensor it computes (still computed by an unnamed
        node of its op)."""
        if n.name:
            return by_name.get(n.name)
        p = producer.get(n.output[0]) if n.output else None
        return p if p is not None and not p.name and p.op_type == n.op_type else None

    later = [now(n) for n in before]
    gone = [m is None for m in later]
    matched = {id(m) for m in later if m is not None}
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(before):
        for t in n.input:
            readers.setdefault(t, []).append(i)

    def upstream(p: Any) -> list[str]:
        """`p` and the added nodes it reads, through added nodes only."""
        seen: dict[int, str] = {}
        todo = [p]
        while todo:
            n = todo.pop()
            if id(n) not in seen:
                seen[id(n)] = key(n)
                todo += [producer[t] for t in n.input if t in producer and id(producer[t]) not in matched]
        return list(seen.values())

    def read_now(k: int, t: str) -> list[str]:
        """What kept node `k` reads now in the slots where it read `t`."""
        reads = later[k].input
        return [reads[j] for j, x in enumerate(before[k].input) if x == t and j < len(reads) and reads[j]]

    took: dict[int, list[str]] = {}
    for i in reversed(range(len(before))):  # topological order, reversed: a removed node's removed readers first
        if not gone[i]:
            continue
        found: list[str] = []
        for t in before[i].output:
            p = producer.get(t)
            if p is not None:  # the same tensor, computed by another node now
                found += upstream(p) if id(p) not in matched else [key(p)]
                continue
            for k in readers.get(t, []):
                if gone[k]:  # removed too: its value flows on through it
                    found += took.get(k, [])
                    continue
                found += [x for s in read_now(k, t) if (p := producer.get(s)) is not None and id(p) not in matched
                          for x in upstream(p)]
        took[i] = list(dict.fromkeys(n for n in found if n))
    nodes = {k: names for i, names in took.items() if (k := key(before[i]))} if any(gone) else {}

    present = set(_tensors(after))
    made = {o for n in before for o in n.output}
    moved: dict[str, tuple[bool, list[str]]] = {}
    ahead: dict[str, list[str]] = {}

    def onward(t: str) -> list[str]:
        """The tensors of `after` computed from `t` in its place: what kept readers read now, through removed ones."""
        if t not in ahead:
            ahead[t] = []
            found: list[str] = []
            for k in readers.get(t, []):
                if not gone[k]:
                    found += read_now(k, t)
                    continue
                for o in before[k].output:  # a removed reader: what its outputs became
                    found += [o] if o in present else onward(o)
            ahead[t] = list(dict.fromkeys(found))
        return ahead[t]

    by_key = {key(n): n for n in after}
    known = set(_tensors(before))

    def constants(t: str) -> list[str]:
        """The new tensors read by the nodes that took the place of a removed constant's readers, or that its kept
        readers read in its slots now (the folded constants it went into)."""
        found = [s for k in readers.get(t, []) if not gone[k] for s in read_now(k, t)]
        found += [s for k in readers.get(t, []) if gone[k] for p in took.get(k, []) if p in by_key
                  for s in by_key[p].input if s and s not in known and s not in producer]
        return list(dict.fromkeys(found))

    for t in _tensors(before):
        if t in present:
            continue
        if t not in made:
            moved[t] = (False, constants(t))
            continue
        # an activation a kept node reads the same way now (an Identity removed, a group rewritten under it)
        direct = {s for k in readers.get(t, []) if not gone[k] for s in read_now(k, t)}
        moved[t] = (True, [direct.pop()]) if len(direct) == 1 else (False, onward(t))
    return nodes, moved


# what onnxruntime's optimizer appends to a node's name for a node it makes of it (Graph::GenerateNodeName, the copy
# of a DequantizeLinear for each reader)
_ORT_MADE = re.compile(r"(/duplicated.*|_token_\d+)$")


class Names:
    """A prepared model's nodes (by key()) and tensors, and the user's names prepare recorded for what it rewrote
    (KEY)."""

    def __init__(self, model: Any) -> None:
        self.nodes = [k for n in model.graph.node if (k := key(n))]
        props = {p.key: p.value for p in model.metadata_props}
        record = json.loads(props.get(KEY, "{}"))
        self.became: dict[str, list[str]] = record.get("became", {})
        self.origin: dict[str, list[str]] = record.get("from", {})
        self.carried: dict[str, str] = record.get("tensors", {})
        self.folded: dict[str, list[str]] = record.get("folded", {})
        self.tensor_from: dict[str, str] = record.get("tensor_from", {})
        self.own_qdq = set(record.get("qdq", []))
        self._have = set(self.nodes)
        self._ops: dict[str, list[str]] = {}  # key -> how each node of that key is told apart (op, named or not)
        for n in model.graph.node:
            self._ops.setdefault(key(n), []).append(f"{n.op_type} {'named' if n.name else 'unnamed, first output'} "
                                                    f"'{key(n)}'")
        g = model.graph
        self.tensors = set(_tensors(g.node)) | {i.name for i in (*g.initializer, *g.input, *g.output)}

    def resolve(self, name: str) -> list[str] | None:
        """The prepared nodes (by key()) a name stands for: itself (a user's node prepare kept, or one of its own),
        what prepare made of a user's node ([]: folded into constants), or None when neither model has it."""
        if name in self._have:
            return [name]
        return self.became.get(name)

    def ambiguous(self, name: str) -> list[str]:
        """The nodes `name` could stand for when it is more than one (else []): two nodes of one key (a node named as
        another, unnamed one's first output), or a node of the prepared model that a user's node of that name, which
        prepare rewrote, is not."""
        found = list(self._ops.get(name, [])) if name in self._have else []
        if name in self.became and self.became[name] != [name] and found:
            found.append(f"the user's node '{name}', which prepare made into {', '.join(self.became[name]) or 'constants'}")
        return found if len(found) > 1 else []

    def tensor(self, name: str) -> str | list[str] | None:
        """The prepared tensor a tensor name stands for: itself, or the one carrying a user's tensor's value after
        prepare's rewrites; a list when prepare folded it away (the tensors computed from it in its place, maybe
        none); None when neither model has it."""
        if name in self.tensors:
            return name
        return self.carried.get(name, self.folded.get(name))

    def user_tensor(self, name: str) -> str:
        """The user's name for a tensor of the prepared model (or of a model made from it keeping its tensor names):
        its own, or the user tensor whose value prepare carries in it under a new name. A tensor prepare computes
        that no tensor of the user's model holds (inside a rewritten group) keeps prepare's name, which
        quantization.tensors takes as well."""
        return self.tensor_from.get(name, name)

    def user(self, name: str) -> str:
        """The user's name for a prepared node (by key()): its own, or for a node prepare added, the user node it
        replaced whose name it carries (`<name>_...` as legalization names them), else the user node it copies
        (onnxruntime names a DequantizeLinear's copy for each reader `<name>/duplicated...`), else the last node it
        replaced (the one computing the replaced group's output). A name neither model has that onnxruntime's
        optimizer made from a node's at compile (`<name>_token_<n>`, `<name>/duplicated...`), or one of the nodes
        quantize writes a node prepare made out as (`<name>/...`): that node's."""
        users = self.origin.get(name)
        if not users:
            base = _ORT_MADE.sub("", name)
            if name not in self._have and (base in self._have or base in self.origin):
                return self.user(base)
            # a node prepare made, written out again for the quantizer (a fused RMSNorm: `<name>/<Op>_<k>`)
            made = [name[:i] for i, c in enumerate(name) if c == "/" and name[:i] in self.origin]
            return self.user(made[-1]) if made else name
        return max((u for u in users if _extends(name, u, "_/")), key=len, default=None) or max(
            (u for u in self._parents(name) if u not in self.origin), key=len, default=users[-1])

    def _parents(self, name: str) -> list[str]:
        """The nodes `name` extends as `<node>/...` (a copy of a kept node: `<name>/duplicated...`)."""
        cut = [i for i, c in enumerate(name) if c == "/"]
        return [name[:i] for i in cut if name[:i] in self._have]

    def label(self, node: Any) -> str:
        """The user's name for a node of the prepared model (or of a model made from it keeping its node names)."""
        return self.user(key(node))

    def canonical(self, nodes: dict[str, Any]) -> dict[str, Any]:
        """quantization.nodes with each name replaced by the user's names of what it stands for (one name per
        prepared node, as the diagnosis names it: the mixed rung adds to a candidate's own pins without setting one
        node twice under two names); a name that stands for nothing stays."""
        out: dict[str, Any] = {}
        for name, o in nodes.items():
            found = self.resolve(name)
            out.update({self.user(p): o for p in found} if found else {name: o})
        return out

    def close(self, name: str) -> str | None:
        """The user's node name closest to `name` (a typo's fix), else a prepared one's, else None."""
        users = [n for n in self.nodes if n not in self.origin] + list(self.became)
        found = difflib.get_close_matches(name, users, n=1) or difflib.get_close_matches(name, list(self.origin), n=1)
        return found[0] if found else None

    def close_tensor(self, name: str) -> str | None:
        """The tensor name closest to `name`, the user's model's first."""
        users = sorted(set(self.carried) | set(self.folded) | (self.tensors - set(self.carried.values())))
        found = difflib.get_close_matches(name, users, n=1)
        return found[0] if found else None


# onnxruntime's quantizer names the input of a graph output's QuantizeLinear so: the node computing a graph output
# writes `<output>_QuantizeLinear_Input` in the QDQ model.
_QDQ_OUTPUT = "_QuantizeLinear_Input"
# ... and the QuantizeLinear/DequantizeLinear it adds for tensor t `t_QuantizeLinear`/`t_DequantizeLinear` (`_<n>`
# after it: one reader's own pair; `t_convert`, `t_convert_clone`: a change of type between readers);
# onnxruntime's optimizer names the copy of a DequantizeLinear it makes for each reader `<name>/duplicated...`.
_QDQ_NODE = re.compile(r"^(.+?)(?:_convert(?:_clone)?)?_(QuantizeLinear|DequantizeLinear)(?:_\d+)?(?:/duplicated.*)?$")


def named(model: Any, nodes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The user's names for (name, op type) nodes of `model`, a model made from the prepared one keeping its node
    names and metadata (the QDQ model: onnxruntime's quantizer keeps the float nodes' names). A QuantizeLinear or
    DequantizeLinear the quantizer added is named after the user's tensor it quantizes, "the DequantizeLinear of
    'x'" (what quantization.tensors takes; shown() lists it without its op again). An unnamed node, which a
    compiler's log names '', by its first output (as the diagnosis names it) when the model's unnamed nodes of that
    op are exactly the ones listed; else '?'. Each user node once (prepare's copies of one node are one)."""
    names = Names(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    unnamed: dict[str, list[str]] = {}
    for n in model.graph.node:
        if not n.name and n.output:
            unnamed.setdefault(n.op_type, []).append(names.user(n.output[0].removesuffix(_QDQ_OUTPUT)))
    listed = {op: sum(1 for name, o in nodes if not name and o == op) for _, op in nodes}
    out = []
    for name, op in nodes:
        if (qdq := _QDQ_NODE.match(name)) and qdq.group(2) == op and name.split("/duplicated")[0] not in names.own_qdq:
            out.append((_quantizes(names, producer.get(qdq.group(1)), qdq.group(1), op), op))
        elif name:  # a name, or from a fallback compile's wrapper an unnamed node's key
            out.append((names.user(name.removesuffix(_QDQ_OUTPUT)), op))
        elif len(unnamed.get(op, [])) == listed[op]:
            out.append((unnamed[op].pop(0), op))
        else:
            out.append(("?", op))
    return list(dict.fromkeys(out))


def _quantizes(names: Names, producer: Any, tensor: str, op: str) -> str:
    """A quantizer's Q/DQ of `tensor` (computed by `producer` in the model, None for a weight), by the user's name
    for the tensor; a tensor computed by a node prepare (or an LLM plug-in) made, which no tensor of the user's
    holds, by its own name and the user's node computing it; a weight prepare folded, with the user's it came
    from."""
    said = f"the {op} of '{names.user_tensor(tensor)}'"
    if producer is None:  # a weight: one prepare folded from the user's (a BatchNorm into its Conv) says so
        sources = [t for t, into in names.folded.items() if tensor in into]
        return said + (f" (prepare's, folded from {', '.join(repr(t) for t in sources[:4])}"
                       f"{', ...' if len(sources) > 4 else ''})" if sources else "")
    if producer.op_type in ("QuantizeLinear", "DequantizeLinear") or tensor in names.tensor_from:
        return said
    mine = names.user(key(producer))
    return said if mine == key(producer) else f"{said} (computed in '{mine}')"


# The QDQ model's record of the recipe's per-tensor and per-node overrides (quantize), by the prepared model's names:
# QNN's refusal of a node they reach names them (a 16-bit activation into an 8-bit-weights Conv, say).
OVERRIDES = "ctxbuild.quantization_overrides"


def overrides_on(model: Any, nodes: list[tuple[str, str]]) -> str | None:
    """The recipe's quantization.tensors / quantization.nodes entries that reach the (name, op) nodes QNN refused in
    `model` (a QDQ model quantize recorded them in), by the user's names ("quantization.tensors 'x', 'w2'"): a node
    pinned itself, or a tensor it reads or writes (through the quantizer's QuantizeLinear/DequantizeLinear; a
    weight, through its `<name>_quantized` initializer). None when none does."""
    record = json.loads({p.key: p.value for p in model.metadata_props}.get(OVERRIDES, "{}"))
    if not record:
        return None
    names = Names(model)
    by_name = {n.name: n for n in model.graph.node if n.name}
    producer = {o: n for n in model.graph.node for o in n.output}
    said: dict[str, list[str]] = {"nodes": [], "tensors": []}
    for name, _ in nodes:
        node = by_name.get(name) or by_name.get(names.user(name))  # the log's `<name>_token_<n>`: the node
        if node is None:
            continue
        if node.name in record.get("nodes", []):
            said["nodes"].append(names.user(node.name))
        for t in (*node.input, *node.output):
            while (p := producer.get(t)) is not None and p.op_type in ("QuantizeLinear", "DequantizeLinear"):
                t = p.input[0]
            if (t := t.removesuffix(_QUANTIZED)) in record.get("tensors", []):
                said["tensors"].append(names.user_tensor(t))
    fields = [f"quantization.{f} " + ", ".join(repr(x) for x in dict.fromkeys(v)) for f, v in said.items() if v]
    return "; ".join(fields) or None


_QUANTIZED = "_quantized"  # onnxruntime's quantizer names a weight's quantized initializer `<weight>_quantized`


def shown(name: str, op: str) -> str:
    """One node of named() in a list: `name (op)`, a quantizer's Q/DQ as named() describes it (its op said)."""
    return name if name.startswith(f"the {op} of '") else f"{name} ({op})"
