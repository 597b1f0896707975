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

Matched: Log(Clip(m, lo[, hi])) or Log(Max(m, lo)), lo > 0 and hi constants, m reached from a square (Mul(x, x),
Pow(x, 2)) through ops linear in it, each read by the next alone: MatMul by a constant, ReduceSum/ReduceMean,
Transpose, Reshape, Slice, Squeeze, Unsqueeze, Flatten, Identity. The squares' sums (a ReduceSum's count, a
MatMul's largest column of absolute sums) set K, so the scaled values stay under 2^15."""
from __future__ import annotations

from math import log, prod, sqrt
from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "log_power"
OPS = ("Log",)
WHAT = ("log of a floored power spectrum (log-mel front ends) -> scaled into fp16's range at run time, the floor "
        "in the log domain (fp16 underflow; the HTP's Log(0) is finite)")
BUDGET = 2.0 ** 15  # the largest value the scaled squares may sum to: half of fp16's 65504
LINEAR = ("Transpose", "Reshape", "Slice", "Squeeze", "Unsqueeze", "Flatten", "Identity", "ReduceMean")


def wanted(g: GraphView) -> bool:
    return any(_floor(g, n) is not None for n in g.graph.node if n.op_type == "Log")


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Log"]:
        floor = _floor(g, node)
        if floor is None:
            continue
        m, lo, hi = floor
        found = _power(g, m, shapes)
        if isinstance(found, str):
            g.keep(node, found)
            continue
        x, square, gain = found
        base = node.name or "log_power"
        k = sqrt(BUDGET / gain)
        r = _scale(g, x, k, base)
        scaled = g.node("Mul", [x, r], f"{base}_scaled").output[0]
        square.input[:] = [scaled if i == x else i for i in square.input]
        # the floor scaled as m is (exact in float32; 0 in fp16 for Whisper's 1e-10, where the Max after the Log
        # floors instead): the Log's input stays finite for a quantizer's calibration
        lo_r = g.node("Mul", [g.add_const(f"{base}_floor_value", np.array(lo, np.float32)), r], f"{base}_floor_r")
        lo_rr = g.node("Mul", [lo_r.output[0], r], f"{base}_floor_rr").output[0]
        log_m = g.node("Log", [g.node("Max", [m, lo_rr], f"{base}_floored").output[0]], f"{base}_log").output[0]
        log_r = g.node("Log", [r], f"{base}_log_scale").output[0]
        twice = g.node("Add", [log_r, log_r], f"{base}_log_scale2").output[0]
        y = g.node("Sub", [log_m, twice], f"{base}_unscaled").output[0]
        log_lo = g.add_const(f"{base}_log_floor", np.array(log(lo), np.float32))
        y = g.node("Max", [y, log_lo], f"{base}_floor").output[0]
        if hi is not None:
            y = g.node("Min", [y, g.add_const(f"{base}_log_ceiling", np.array(log(hi), np.float32))],
                       f"{base}_ceiling").output[0]
        # the HTP's Log(0) is finite: a zero (silence, or a product fp16 flushed) takes the floor by a Where
        positive = g.node("Greater", [m, g.add_const(f"{base}_zero", np.array(0, np.float32))], f"{base}_positive")
        g.replace_uses(node.output[0], g.node("Where", [positive.output[0], y, log_lo], f"{base}_where").output[0])
        done += 1
    if done:
        g.reindex()
    return done


def _floor(g: GraphView, log_node: Any) -> tuple[str, float, float | None] | None:
    """(m, lo, hi or None) when `log_node` is Log(Clip(m, lo[, hi])) or Log(Max(m, lo)), lo > 0 and hi constant
    scalars, the floor read by the Log alone."""
    f = g.producer.get(log_node.input[0])
    if f is None or len(g.consumers.get(f.output[0], [])) != 1 or f.output[0] in g.outputs:
        return None
    if f.op_type == "Clip" and len(f.input) > 1 and f.input[1]:
        bounds = [g.const(b) if b else None for b in list(f.input[1:3]) + [""] * (3 - len(f.input))]
        if bounds[0] is None or bounds[0].size != 1 or (len(f.input) > 2 and f.input[2] and bounds[1] is None):
            return None
        lo, hi = float(bounds[0].item()), (float(bounds[1].item()) if bounds[1] is not None else None)
        return (f.input[0], lo, hi) if lo > 0 else None
    if f.op_type == "Max" and len(f.input) == 2:
        for k in (0, 1):
            c = g.const(f.input[k])
            if c is not None and c.size == 1 and float(c.item()) > 0 and g.const(f.input[1 - k]) is None:
                return f.input[1 - k], float(c.item()), None
    return None


def _power(g: GraphView, m: str, shapes: dict[str, list[int]]) -> tuple[str, Any, float] | str:
    """(x, the square node, how much the ops after it can sum: the factor on x's largest square) when `m` is
    linear in a square of x, each tensor on the way read by the next node alone; else why not."""
    gain = 1.0
    t = m
    while True:
        n = g.producer.get(t)
        if n is None:
            return f"'{t}' is not computed from a square (Mul(x, x) or Pow(x, 2)) by linear ops"
        if t in g.outputs or len(g.consumers.get(t, [])) != 1:
            return f"'{t}' is read elsewhere too: scaling it would change that reader"
        x = g.squared(n)
        if x is not None:
            return x, n, gain
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


def _shape(g: GraphView, t: str, shapes: dict[str, list[int]]) -> list[int] | None:
    """t's static shape; for a square a rule before this one wrote (sum_squares), its operand's."""
    if t in shapes:
        return shapes[t]
    n = g.producer.get(t)
    x = g.squared(n) if n is not None else None
    return shapes.get(x) if x is not None and n.op_type == "Mul" else None


def _scale(g: GraphView, x: str, k: float, base: str) -> str:
    """r = k / max(max|x|, k / 2^15), a [1]-shaped tensor: the largest |x * r| is k (r at most 2^15, so an
    all-zero x gives zeros, not 0 * inf)."""
    # keepdims 0, then [1]: with keepdims 1 (no axes) QNN 2.51's compiler aborts (measured, fp16)
    peak = g.node("ReduceMax", [g.node("Abs", [x], f"{base}_abs").output[0]], f"{base}_peak", keepdims=0).output[0]
    peak = g.node("Reshape", [peak, g.add_const(f"{base}_one", np.array([1], np.int64))], f"{base}_peak1").output[0]
    peak = g.node("Max", [peak, g.add_const(f"{base}_least", np.array(k / BUDGET, np.float32))],
                  f"{base}_guard").output[0]
    return g.node("Div", [g.add_const(f"{base}_target", np.array(k, np.float32)), peak], f"{base}_scale").output[0]
