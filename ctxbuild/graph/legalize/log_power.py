"""The log of a floored power spectrum -> the spectrum scaled into fp16's range at run time, the scale's log
taken back out after the Log, the floor applied in the log domain.

Not an op the HTP refuses, values fp16 cannot hold: a log-mel front end squares an STFT, sums it through a mel
filter bank and takes Log(Clip(mel, 1e-10)). Speech spans more than fp16 holds there: the squares of a loud
recording reach 1e4 while a quiet one's whole spectrum is below 0.1, and the HTP flushes products under fp16's
smallest normal (6.1e-5) to 0. The floor itself is 0 in fp16 (1e-10 is below its smallest subnormal, 6e-8), and
the HTP's Log(0) is -7.6, not -inf: silence and quiet bins come out louder than the speech around them (onnx-asr's
Whisper front end at fp16: cosine -0.62). The rule multiplies the squared tensor x by r = K / max|x| (a runtime
scalar, so loud and quiet inputs alike put their largest square near K^2, below 65504 with the sums after it
counted), and computes log(max(mel, lo)) for the scaled m = r^2 * mel as Max(Log(Max(m, lo r^2)) - 2 log r, log lo),
and log lo where m is 0 (Where(m > 0, ...): digital silence, or squares fp16 flushed; the HTP's Log(0) would pass
the floor). The same values in float32, where the Max after the Log changes nothing; in fp16 lo r^2 may be 0, and
it is that Max which floors.

Matched: Log(Clip(m, lo[, hi])), Log(Max(m, lo)), Log(Add(m, c)) or Log(Add(c, Mul(m, k))) (log(c + k m) =
log k + log(m + c/k): TensorFlow's `log(x + eps)`; silero-vad v4's `log(1 + 2^20 |STFT|)`, whose product passes
fp16's 65504), lo, c, k > 0 and hi constants; m homogeneous in squared tensors: squares (Mul(x, x), Pow(x, 2);
the square of a Sqrt is its input), Sqrt, the Add of two such terms (|re|^2 + |im|^2), and ops linear in them:
MatMul by a constant, ReduceSum/ReduceMean, Transpose, Reshape, Slice, Squeeze, Unsqueeze, Flatten, Identity.
Every squared tensor is scaled by the same r (from their largest magnitude), so m by r^d for its degree d (2 for a
power, 1 for a magnitude). The squares' sums (a ReduceSum's count, a MatMul's largest column of absolute sums, an
Add's terms) set K, so the scaled values stay under 2^15. The nodes from the squares to the Log are copied to take
the scaled tensors: a power or magnitude the model also reads elsewhere (silero-vad v4 concatenates its magnitude
with the log) keeps its values there."""
from __future__ import annotations

from dataclasses import dataclass, field
from math import log, prod, sqrt
from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "log_power"
OPS = ("Log",)
WHAT = ("log of a floored power spectrum (log-mel front ends) -> scaled into fp16's range at run time, the floor "
        "in the log domain (fp16 underflow; the HTP's Log(0) is finite)")
BUDGET = 2.0 ** 15  # the largest value the scaled squares may sum to: half of fp16's 65504
SCALED = "ctxbuild log_power: scaled into fp16's range"  # the doc_string of the Log it writes (the diagnosis reads it)
LINEAR = ("Transpose", "Reshape", "Slice", "Squeeze", "Unsqueeze", "Flatten", "Identity", "ReduceMean")


@dataclass
class Floor:
    """log(max(m, lo)) [min hi], or log(m + lo) + offset when `added` (log(c + k m): lo = c/k, offset = log k)."""
    m: str
    lo: float
    hi: float | None = None
    added: bool = False
    offset: float = 0.0


@dataclass
class Power:
    """m computed by `nodes` (from m's producer back to the squares) from the squares of tensors (square node,
    its operand), of degree `degree` in them, its sums adding up to `gain` times their largest square. `same`:
    squares of a Sqrt among the nodes, by id -> the Sqrt's input, which they equal."""
    nodes: list[Any]
    squares: list[tuple[Any, str]]
    degree: float
    gain: float
    same: dict[int, str] = field(default_factory=dict)


def wanted(g: GraphView) -> bool:
    return any(_floor(g, n) is not None for n in g.graph.node if n.op_type == "Log")


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Log"]:
        floor = _floor(g, node)
        if floor is None:
            continue
        found = _power(g, floor.m, shapes)
        if isinstance(found, str):
            g.keep(node, found)
            continue
        if found.degree != int(found.degree):
            g.keep(node, f"'{floor.m}' is of degree {found.degree} in its squares, not a whole power")
            continue
        base = node.name or "log_power"
        d = int(found.degree)
        r = _scale(g, sorted({x for _, x in found.squares}), sqrt(BUDGET / found.gain), base)
        m = _scaled_copy(g, found, r, base)[floor.m]
        # the floor scaled as m is, lo r^d (exact in float32; 0 in fp16 for Whisper's 1e-10, where the Max after
        # the Log floors instead): the Log's input stays finite for a quantizer's calibration
        lo_r = g.add_const(f"{base}_floor_value", np.array(floor.lo, np.float32))
        for _ in range(d):
            lo_r = g.node("Mul", [lo_r, r], f"{base}_floor_r").output[0]
        floored = g.node("Add" if floor.added else "Max", [m, lo_r], f"{base}_floored").output[0]
        log_m = g.node("Log", [floored], f"{base}_log", doc_string=SCALED).output[0]
        log_r = g.node("Log", [r], f"{base}_log_scale").output[0]
        unscale = g.node("Mul", [log_r, g.add_const(f"{base}_degree", np.array(d, np.float32))],
                         f"{base}_log_scale{d}").output[0]
        y = g.node("Sub", [log_m, unscale], f"{base}_unscaled").output[0]
        if floor.offset:
            y = g.node("Add", [y, g.add_const(f"{base}_offset", np.array(floor.offset, np.float32))],
                       f"{base}_offset").output[0]
        log_lo = g.add_const(f"{base}_log_floor", np.array(log(floor.lo) + floor.offset, np.float32))
        y = g.node("Max", [y, log_lo], f"{base}_floor").output[0]
        if floor.hi is not None:
            y = g.node("Min", [y, g.add_const(f"{base}_log_ceiling", np.array(log(floor.hi), np.float32))],
                       f"{base}_ceiling").output[0]
        # the HTP's Log(0) is finite: a zero (silence, or a product fp16 flushed) takes the floor by a Where
        positive = g.node("Greater", [m, g.add_const(f"{base}_zero", np.array(0, np.float32))],
                          f"{base}_positive")
        g.replace_uses(node.output[0], g.node("Where", [positive.output[0], y, log_lo], f"{base}_where").output[0])
        done += 1
    if done:
        g.reindex()
    return done


def _floor(g: GraphView, log_node: Any) -> Floor | None:
    """The Log's floor when its input is Clip(m, lo[, hi]), Max(m, lo), Add(m, c) or Add(c, Mul(m, k)), the
    constants positive scalars (hi any)."""
    f = g.producer.get(log_node.input[0])
    if f is None:
        return None
    if f.op_type == "Clip" and len(f.input) > 1 and f.input[1]:
        bounds = [g.const(b) if b else None for b in list(f.input[1:3]) + [""] * (3 - len(f.input))]
        if bounds[0] is None or bounds[0].size != 1 or (len(f.input) > 2 and f.input[2] and bounds[1] is None):
            return None
        lo, hi = float(bounds[0].item()), (float(bounds[1].item()) if bounds[1] is not None else None)
        return Floor(f.input[0], lo, hi) if lo > 0 else None
    if f.op_type in ("Max", "Add") and len(f.input) == 2:
        for k in (0, 1):
            c, m = _positive(g, f.input[k]), f.input[1 - k]
            if c is None or g.const(m) is not None:
                continue
            if f.op_type == "Max":
                return Floor(m, c)
            scaled = g.producer.get(m)
            if scaled is not None and scaled.op_type == "Mul":
                for j in (0, 1):
                    gain = _positive(g, scaled.input[j])
                    if gain is not None and g.const(scaled.input[1 - j]) is None:
                        return Floor(scaled.input[1 - j], c / gain, added=True, offset=log(gain))
            return Floor(m, c, added=True)
    return None


def _positive(g: GraphView, name: str) -> float | None:
    c = g.const(name)
    return float(c.item()) if c is not None and c.size == 1 and float(c.item()) > 0 else None


def _power(g: GraphView, m: str, shapes: dict[str, list[int]]) -> Power | str:
    """How `m` is computed from squares; else why not."""
    gain, nodes, same = 1.0, [], {}
    t = m
    while True:
        n = g.producer.get(t)
        if n is None:
            return f"'{t}' is not computed from a square (Mul(x, x) or Pow(x, 2)) by linear ops"
        x = g.squared(n)
        if x is not None:
            root = g.producer.get(x)
            if root is not None and root.op_type == "Sqrt":
                nodes.append(n)
                t = same[id(n)] = root.input[0]  # Sqrt(s)^2 = s: the square of a magnitude is its power
                continue
            return Power(nodes + [n], [(n, x)], 2.0, gain, same)
        nodes.append(n)
        if n.op_type == "Sqrt":
            inner = _power(g, n.input[0], shapes)
            return inner if isinstance(inner, str) else Power(nodes + inner.nodes, inner.squares, inner.degree / 2,
                                                              gain * inner.gain, same | inner.same)
        if n.op_type == "Add" and all(g.const(i) is None for i in n.input):
            terms = [_power(g, i, shapes) for i in n.input]
            why = next((p for p in terms if isinstance(p, str)), None)
            if why is not None:
                return why
            a, b = terms
            if a.degree != b.degree:
                return f"'{n.name}' (Add) adds terms of degrees {a.degree} and {b.degree} in their squares"
            return Power(nodes + a.nodes + b.nodes, a.squares + b.squares, a.degree, gain * (a.gain + b.gain),
                         same | a.same | b.same)
        if n.op_type == "MatMul":
            w = [(k, g.const(i)) for k, i in enumerate(n.input)]
            known = [(k, v) for k, v in w if v is not None]
            if len(known) != 1 or known[0][1].ndim != 2:
                return f"'{n.name}' (MatMul) is not by a constant matrix"
            k, v = known[0]
            gain *= max(1.0, float(np.abs(v).sum(axis=0 if k == 1 else 1).max()))
            t = n.input[1 - k]
            continue
        elif n.op_type == "ReduceSum":
            axes, shape = g.reduce_axes(n), _shape(g, n.input[0], shapes)
            if axes is False or shape is None:
                return f"'{n.name}' (ReduceSum): its count is not known statically"
            gain *= prod(shape[a] for a in axes) if axes else prod(shape)
        elif n.op_type not in LINEAR:
            return f"'{n.name}' ({n.op_type}) between the square and the Log is not one the scale passes through"
        t = n.input[0]


def _scaled_copy(g: GraphView, power: Power, r: str, base: str) -> dict[str, str]:
    """Copies of the power's nodes reading x * r where the originals square x: each original output -> its copy's.
    The originals stay for any other reader (prune drops them where the Log was the only one)."""
    from onnx import NodeProto

    squares = {id(n): x for n, x in power.squares}
    copied: dict[str, str] = {}
    for n in reversed(power.nodes):  # the walk went from m back to the squares: reversed, producers come first
        if id(n) in power.same:
            copied[n.output[0]] = copied[power.same[id(n)]]
            continue
        inputs = [copied.get(i, i) for i in n.input]
        if id(n) in squares:
            x = squares[id(n)]
            scaled = g.node("Mul", [x, r], f"{base}_scaled").output[0]
            inputs = [scaled if i == x else i for i in n.input]
        c = NodeProto()
        c.CopyFrom(n)
        c.name = g.fresh(f"{n.name or n.output[0]}_scaled")
        c.input[:] = inputs
        c.output[:] = [g.fresh(f"{o}_scaled") for o in n.output]
        copied.update(zip(n.output, c.output))
        g.graph.node.append(c)
    return copied


def _shape(g: GraphView, t: str, shapes: dict[str, list[int]]) -> list[int] | None:
    """t's static shape; for a square a rule before this one wrote (sum_squares), its operand's."""
    if t in shapes:
        return shapes[t]
    n = g.producer.get(t)
    x = g.squared(n) if n is not None else None
    return shapes.get(x) if x is not None and n.op_type == "Mul" else None


def _scale(g: GraphView, xs: list[str], k: float, base: str) -> str:
    """r = k / max(max|x| over xs, k / 2^15), a [1]-shaped tensor: the largest |x * r| is k (r at most 2^15, so
    all-zero xs give zeros, not 0 * inf)."""
    # keepdims 0, then [1]: with keepdims 1 (no axes) QNN 2.51's compiler aborts (measured, fp16)
    peaks = [g.node("ReduceMax", [g.node("Abs", [x], f"{base}_abs").output[0]], f"{base}_peak", keepdims=0).output[0]
             for x in xs]
    peak = peaks[0] if len(peaks) == 1 else g.node("Max", peaks, f"{base}_peaks").output[0]
    peak = g.node("Reshape", [peak, g.add_const(f"{base}_one", np.array([1], np.int64))], f"{base}_peak1").output[0]
    peak = g.node("Max", [peak, g.add_const(f"{base}_least", np.array(k / BUDGET, np.float32))],
                  f"{base}_guard").output[0]
    return g.node("Div", [g.add_const(f"{base}_target", np.array(k, np.float32)), peak], f"{base}_scale").output[0]
