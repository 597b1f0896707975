"""1-D Conv with a large dilation d -> the same Conv over the length folded into rows of d (a 2-D Conv with a
(k, 1) kernel): QNN refuses a quantized Conv1d whose input channels x dilation reach 2^18 (finalize fails with
QNN_COMMON_ERROR_MEM_ALLOC; measured at int16: 128 x 2048, 64 x 4096 and 256 x 1024 refused, 128 x 1024 and
32 x 4096 compiled), and its fp16 compile time and memory grow with d (an EEG spindle detector's temporal convs,
128 channels, dilations to 4096: over 15 minutes and 5 GB).

Why exact: y[t] = sum_j w[j] x[t + j d]; with t = q d + r that is sum_j w[j] x[(q + j) d + r], a Conv with kernel
(k, 1) over x folded as [.., rows, d]. The length is zero-padded at the end to whole rows (no output kept reads the
padding) and the output sliced back. In QNN's channel-last layout both folds are plain reshapes."""
from __future__ import annotations

import numpy as np

from ctxbuild.graph.legalize.graphview import GraphView

NAME = "dilated_conv"
OPS = ("Conv",)
WHAT = "1-D Conv with input channels x dilation >= 2^16 -> a (k, 1) Conv over the length folded into rows"
FOLD_AT = 2 ** 16  # input channels x dilation: a quarter of the smallest product measured refused (2^18)


def wanted(g: GraphView) -> bool:
    """A Conv whose weight's dims (read without its data) give channels x dilation >= FOLD_AT, or are unknown."""
    for n in (n for n in g.graph.node if n.op_type == "Conv" and _dilation(n, g) > 1):
        w = g.inits.get(n.input[1])
        if w is None or len(w.dims) != 3 or w.dims[1] * g.attr(n, "group", 1) * _dilation(n, g) >= FOLD_AT:
            return True
    return False


def apply(g: GraphView, shapes: dict[str, list[int]]) -> int:
    done = 0
    for node in [n for n in g.graph.node if n.op_type == "Conv" and _dilation(n, g) > 1]:
        x, w = node.input[0], node.input[1]
        shape, wshape = shapes.get(x), shapes.get(w) or _const_shape(g, w)
        d = _dilation(node, g)
        if shape is not None and len(shape) == 3 and shape[1] * d < FOLD_AT:
            continue  # QNN compiles it as it is
        why = _unfit(g, node, shape, wshape)
        if why:
            g.keep(node, why)
            continue
        k = wshape[2]
        p0, p1 = g.attr(node, "pads", [0, 0])
        out_len = shape[2] + p0 + p1 - d * (k - 1)
        rows = -(-out_len // d)  # output rows of d samples, the last one cut back to out_len
        tail = (rows + k - 1) * d - (shape[2] + p0 + p1)
        base = node.name or "dilated_conv"
        if p0 or p1 or tail:
            pads = g.add_const(f"{base}_pads", np.array([0, 0, p0, 0, 0, p1 + tail], np.int64))
            x = g.node("Pad", [x, pads], f"{base}_pad").output[0]
        folded = g.node("Reshape", [x, g.add_const(f"{base}_rows", np.array([0, 0, rows + k - 1, d], np.int64))],
                        f"{base}_fold").output[0]
        w4 = g.const(w)
        w2 = (g.add_const(f"{w}_rows", w4[..., None]) if w4 is not None else g.unsqueeze(w, [3], f"{base}_weight"))
        conv = g.node("Conv", [folded, w2, *node.input[2:]], f"{base}_rows_conv", kernel_shape=[k, 1],
                      group=g.attr(node, "group", 1)).output[0]
        y = g.node("Reshape", [conv, g.add_const(f"{base}_flat", np.array([0, 0, rows * d], np.int64))],
                   f"{base}_unfold").output[0]
        if rows * d != out_len:
            ends = [g.add_const(f"{base}_{s}", np.array([v], np.int64)) for s, v in (("start", 0), ("end", out_len),
                                                                                      ("axis", 2))]
            y = g.node("Slice", [y, *ends], f"{base}_cut").output[0]
        g.replace_uses(node.output[0], y)
        done += 1
    if done:
        g.reindex()
    return done


def _dilation(node, g: GraphView) -> int:
    dil = g.attr(node, "dilations", [1])
    return int(dil[0]) if len(dil) == 1 else 1


def _const_shape(g: GraphView, name: str) -> list[int] | None:
    value = g.const(name)
    return list(value.shape) if value is not None else None


def _unfit(g: GraphView, node, shape: list[int] | None, wshape: list[int] | None) -> str | None:
    """Why the fold would not be exact or could not be written, else None."""
    if shape is None or len(shape) != 3 or wshape is None:
        return "its input or weight has no static 1-D shape"
    if any(s != 1 for s in g.attr(node, "strides", [1])):
        return "a stride other than 1 (the rows would not line up with the outputs)"
    if g.attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return "auto_pad (explicit pads only)"
    return None
