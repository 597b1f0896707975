"""A variance written as moments, E[x*x] - E[x]^2 -> the centred E[(x - mean)^2], its terms scaled into range.

Not an op the HTP refuses, values fp16 cannot hold: JAX's and TensorFlow's LayerNorm compute the variance from
the sum of squares, and activations in the tens summed squared over hundreds of features pass 65504 and turn
inf. Magika's file-type classifier (a JAX export) sums squares to 1.4e5-3.1e5 over 512 features on real files:
the fp16 build verified at cosine 0.09, SNR -120 dB. The centred form sums ((x - mean) / sqrt N)^2, each term
at most the variance times N/N, the total the variance itself. The same value in exact arithmetic; in float32
the centred form is the more accurate one (no cancellation between two large moments).

Matched: Sub(m2, m*m) with m2 = ReduceSum(x*x) * (1/N) (or / N, or ReduceMean(x*x)) and m = ReduceSum(x) *
(1/N) (or ReduceMean(x)) over the same axes with the same keepdims, N the number of elements reduced, known
from x's static shape (a factor that is not 1/N is not a variance: left, with the reason)."""
from __future__ import annotations

from math import prod
from typing import Any

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "variance"
OPS = ("Sub",)
WHAT = "variance as E[x*x] - E[x]^2 (LayerNorm written out by JAX/TF) -> the centred E[(x - mean)^2] (fp16 overflow)"
# The moments form cancels in float32 where the variance is small against the mean's square (Magika's first
# LayerNorm: variances down to 2e-5 under moments near 0.3), so it is the original that is off by up to ~1e-3 of
# the variance; the centred value moves Magika's probabilities by 1.2e-4 of the largest on one of 4 files.
TOLERANCE = 1e-3


def wanted(g: GraphView) -> bool:
    return any(_match(g, n) is not None for n in g.graph.node if n.op_type == "Sub")


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for sub in [n for n in g.graph.node if n.op_type == "Sub"]:
        found = _match(g, sub)
        if found is None:
            continue
        x, mean, axes, keepdims, factors = found
        shape = shapes.get(x)
        if shape is None:
            g.keep(sub, f"the shape of '{x}' is not known statically: N, the count the moments divide by, is not")
            continue
        axes = sorted({a % len(shape) for a in axes}) if axes else list(range(len(shape)))
        n = prod(shape[a] for a in axes)
        if any(f is not None and not np.isclose(f, 1 / n, rtol=1e-6, atol=0) for f in factors):
            odd = next(f for f in factors if f is not None and not np.isclose(f, 1 / n, rtol=1e-6, atol=0))
            g.keep(sub, f"the moments are scaled by {odd:.4g}, not 1/{n} (the count over axes {axes} of {shape}): "
                        "not a variance")
            continue
        base = sub.name or "variance"
        centre = mean if keepdims else g.unsqueeze(mean, axes, f"{base}_mean")
        dev = g.node("Sub", [x, centre], f"{base}_dev").output[0]
        scale = g.add_const(f"{base}_scale", np.array(1 / np.sqrt(n), _dtype(g, x)))
        scaled = g.node("Mul", [dev, scale], f"{base}_scaled").output[0]
        square = g.node("Mul", [scaled, scaled], f"{base}_square").output[0]
        var = g.reduce_sum(square, axes, keepdims, f"{base}_centred")
        g.replace_uses(sub.output[0], var)
        done += 1
    if done:
        g.reindex()
    return done


def _match(g: GraphView, sub: Any) -> tuple[str, str, list[int] | None, int, list[float | None]] | None:
    """(x, the mean's tensor, axes, keepdims, the two moments' factors: None for a ReduceMean) when `sub` is
    E[x*x] - E[x]^2; else None."""
    second = _moment(g, sub.input[0])
    sq = g.producer.get(sub.input[1])
    m = g.squared(sq) if sq is not None else None
    first = _moment(g, m) if m is not None else None
    if second is None or first is None:
        return None
    sq_in = g.producer.get(second[0])
    x = g.squared(sq_in) if sq_in is not None else None
    if x is None or x != first[0] or second[1:3] != first[1:3]:
        return None
    return x, m, first[1], first[2], [first[3], second[3]]


def _moment(g: GraphView, name: str) -> tuple[str, list[int] | None, int, float | None] | None:
    """(what is averaged, axes, keepdims, the factor: None for ReduceMean) when `name` is ReduceMean(v) or
    ReduceSum(v) times a constant (or divided by one)."""
    node = g.producer.get(name)
    if node is None:
        return None
    factor = None
    if node.op_type in ("Mul", "Div"):
        consts = [(k, g.const(i)) for k, i in enumerate(node.input)]
        known = [(k, c) for k, c in consts if c is not None and c.size == 1 and c.dtype.kind == "f"]
        if len(known) != 1 or (node.op_type == "Div" and known[0][0] != 1):
            return None
        k, c = known[0]
        factor = float(c.item()) if node.op_type == "Mul" else 1 / float(c.item())
        node = g.producer.get(node.input[1 - k])
        if node is None or node.op_type != "ReduceSum":
            return None
    elif node.op_type != "ReduceMean":
        return None
    axes = g.reduce_axes(node)
    if axes is False:
        return None
    return node.input[0], axes, g.attr(node, "keepdims", 1), factor


def _dtype(g: GraphView, x: str) -> type:
    from onnx import helper

    for vi in list(g.graph.input) + list(g.graph.value_info):
        if vi.name == x:
            return helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    return np.float32
