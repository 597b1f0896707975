"""Attention-mask fill values (Where(mask, 0, -inf or -3.4e38) added to Softmax logits) -> -100.

Not an op the HTP refuses: a value quantization cannot hold. Calibration takes the fill value into the range
of the masked logits, so with -3.4e38 every real logit rounds to one step (a BERT-style embedder at int16:
cosine 0.28). exp(-100) underflows float32 like exp(-inf) does, so the float model keeps its outputs while no
logit is 100 above another (attention logits are tens at most).

Rewritten only in the additive form: the Where picks between the fill and a constant at least MARGIN above -100
(0 as exports write it, a scalar or a tensor of zeros), and its result, moved to the scores' shape by data moves
(Reshape, Expand, ...: torch's key padding mask), is added to the scores. Then the masked logits are the scores minus 100
and the rewrite does not depend on the scores' level. Where the fill replaces the scores themselves
(Where(mask, scores, -inf) -> Softmax), kept scores below -100 would leave the masked positions all the weight,
and nothing on the graph bounds them: left as written. What the graph cannot show (scores 100 apart, a row with
every position masked) the sample check after the rules catches (check.py)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "mask_fill"
OPS = ("Where",)
WHAT = "attention-mask fill (-inf, -3.4e38, -1e9 ...) added to Softmax logits -> -100"
FILL = -100.0
HUGE = -1e4  # fills at or below this are masks, not values
MARGIN = 80.0  # the kept value lies this far above the fill at least: exp(-80) ~ 2e-35, nothing in float32
# Ops that only move or repeat values (their first input): a fill moved by them is the same fill
MOVES = ("Reshape", "Expand", "Unsqueeze", "Squeeze", "Transpose", "Flatten", "Tile", "Identity")


def wanted(g: GraphView) -> bool:
    return any(n.op_type == "Where" and _feeds_softmax(g, n.output[0]) for n in g.graph.node)


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Where"]:
        if not _feeds_softmax(g, node.output[0]):
            continue
        for k in (1, 2):
            value = g.const(node.input[k])
            if value is None or value.size != 1 or value.dtype.kind != "f" or float(value.item()) > HUGE:
                continue
            why = _not_additive(g, node, node.input[3 - k])
            if why:
                g.keep(node, why)
                continue
            node.input[k] = g.add_const(f"{node.input[k]}_mask", np.full(value.shape, FILL, value.dtype))
            done += 1
    return done


def _not_additive(g: GraphView, where: Any, kept: str) -> str | None:
    """Why `where` (a fill feeding a Softmax) is not an additive mask the rewrite keeps exact, or None."""
    if not _added(g, where.output[0]):
        return (f"the fill replaces the scores on their way to the Softmax (not added to them): -{-FILL:g} is "
                "exact only while every kept score stays above it, which the graph does not bound")
    value = g.const(kept)
    if value is None:
        return (f"the kept branch '{kept}' is computed at run time: -{-FILL:g} is exact only while it stays "
                f"{MARGIN:g} above the fill, which the graph does not bound")
    if value.dtype.kind != "f" or not np.isfinite(value).all() or float(value.min()) < FILL + MARGIN:
        return f"the kept branch '{kept}' is not a finite constant at least {MARGIN:g} above -{-FILL:g}"
    return None


def _feeds_softmax(g: GraphView, name: str, depth: int = 3, moves: int = 6) -> bool:
    """Every use of `name` is an Add whose result reaches a Softmax through Adds only (or the Softmax), or a data
    move (MOVES, reading it as its data) whose result does."""
    uses = g.consumers.get(name, [])
    if not uses or depth == 0:
        return False
    return all(u.op_type == "Softmax" or (u.op_type == "Add" and _feeds_softmax(g, u.output[0], depth - 1, moves))
               or (_moves(u, name) and moves > 0 and _feeds_softmax(g, u.output[0], depth, moves - 1))
               for u in uses)


def _added(g: GraphView, name: str, moves: int = 6) -> bool:
    """Every use of `name`, past data moves, is an Add (the fill is added to the scores, not put in their place)."""
    uses = g.consumers.get(name, [])
    return bool(uses) and all(u.op_type == "Add" or (_moves(u, name) and moves > 0 and _added(g, u.output[0], moves - 1))
                              for u in uses)


def _moves(node: Any, name: str) -> bool:
    return node.op_type in MOVES and node.input[0] == name and name not in node.input[1:]
