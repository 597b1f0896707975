"""Legalization: rewrite ops the HTP does not run (or runs wrongly in fp16 or once quantized) into equivalent ops
it does, one small rule per pattern (docs/legalization.md lists them).

Each rule module has NAME, OPS (the op types that make it look), WHAT (one line for docs and summaries),
`apply(view, shapes) -> count` and optionally `wanted(view) -> bool`, a finer check on the graph alone (the
weights are loaded only when some rule wants them: a transformer has ReduceMean and Where everywhere), and
TOLERANCE when its rewrite is not meant to keep the outputs to float precision (check.py). A rule rewrites only
where the conditions its rewrite is exact under hold on the graph; where its pattern is found without them it
leaves the node and says why (GraphView.keep). prepare runs the rules after fixing shapes and folding constants
(indices that were Shape chains are constants by then), then checks the rewritten model against the model before
on samples (check.py); `tests/e2e/test_legalize.py` proves each rule on onnxruntime's CPU EP."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection

from ctxbuild.graph.legalize import (batchnorm_params, clip, conv_gelu_clip, convtranspose, dilated_conv,
                                     dynamic_int8, einsum, gathernd, gelu, hardswish_order, int8_tables, log_power,
                                     mask_fill, ort_fused, qdq_bias, qdq_unsigned, qdq_weights, rmsnorm, sigmoid_exp,
                                     static_shapes, sum_squares, variance)
from ctxbuild.graph.legalize.graphview import GraphView, static_shapes_of
from ctxbuild.graph.nodenames import Outline, outline

# The QDQ rules first: the shape and weight constants they fold are what the later rules' conditions read;
# sum_squares before log_power, which finds the square its ReduceSumSquare becomes.
RULES = (static_shapes, qdq_weights, qdq_unsigned, qdq_bias, batchnorm_params, int8_tables, dynamic_int8, ort_fused,
         einsum, gathernd, clip, rmsnorm, variance, sum_squares, log_power, gelu, mask_fill, convtranspose,
         dilated_conv)
# Rules for fp16 builds alone, applied by compile (prepare's model is shared with the quantized candidates):
# what the HTP's fp16 arithmetic computes coarsely, where the rewrite would not quantize.
FP16_RULES = (sigmoid_exp, hardswish_order, conv_gelu_clip)
METADATA_KEY = "ctxbuild.rewrites"
KEPT_KEY = "ctxbuild.kept"  # rule -> the patterns left as written and why
WITHDRAWN_KEY = "ctxbuild.withdrawn"  # rule -> why the sample check withdrew its rewrites
SPLIT_KEY = "ctxbuild.split"  # the split hint prepare's sample check met: the model's sizes follow its data
KEPT_LISTED = 5  # per rule: a model with a hundred such nodes lists the first ones and the count


@dataclass
class Legalized:
    rewrites: dict[str, int] = field(default_factory=dict)  # rule -> rewrites made
    kept: dict[str, list[str]] = field(default_factory=dict)  # rule -> "'node' (Op): why" for patterns left alone
    steps: list[list[Outline]] = field(default_factory=list)  # the nodes after each rule that rewrote (nodenames)


def may_apply(model: Any, only: Collection[str] | None = None) -> bool:
    """Whether the model has an op some rule (of `only`, if given) looks at."""
    present = {n.op_type for n in model.graph.node}
    return any(set(r.OPS) & present for r in _rules(only))


def wanted(model: Any, only: Collection[str] | None = None) -> bool:
    """Whether any rule (of `only`, if given) could apply: a scan of the graph, the weights need not be loaded."""
    present = {n.op_type for n in model.graph.node}
    view = GraphView(model)
    return any(set(r.OPS) & present and getattr(r, "wanted", lambda g: True)(view) for r in _rules(only))


def legalize(model: Any, only: Collection[str] | None = None) -> Legalized:
    """Rewrite `model` (weights loaded) in place with every rule, or those named in `only` (prepare.rewrite):
    the rewrites made and the patterns left as written, by rule."""
    shapes = static_shapes_of(model)
    view = GraphView(model)
    done = Legalized()
    for rule in _rules(only):
        n = rule.apply(view, shapes)
        if view.kept:
            more = len(view.kept) - KEPT_LISTED
            done.kept[rule.NAME] = view.kept[:KEPT_LISTED] + ([f"and {more} more"] if more > 0 else [])
            view.kept = []
        if n:
            done.rewrites[rule.NAME] = n
            view.prune()
            done.steps.append(outline(model))
    if done.rewrites:
        del model.graph.value_info[:]  # rewired tensors may change type (int8 -> float): onnxruntime re-infers
    return done


def withdrawn(model: Any) -> dict[str, str]:
    """rule -> why the sample check withdrew it, from a prepared model's metadata (empty: none, or not prepared)."""
    return _recorded(model, WITHDRAWN_KEY) or {}


def split_met(model: Any) -> str | None:
    """The split hint (the `outputs:` line) prepare's sample check met on this prepared model, if it did."""
    return _recorded(model, SPLIT_KEY)


def _recorded(model: Any, key: str) -> Any:
    import json

    props = {p.key: p.value for p in model.metadata_props}
    return json.loads(props[key]) if key in props else None


def fp16_rules(rewrite: bool | Collection[str]) -> list[str]:
    """The fp16 rules prepare.rewrite allows (true: all; false: none; a list: those it names)."""
    return [r.NAME for r in FP16_RULES if rewrite is True or (rewrite and r.NAME in rewrite)]


def legalize_fp16(model: Any, rules: Collection[str]) -> dict[str, int]:
    """Rewrite `model` (its weights need not be loaded) in place with the fp16 rules named: rule -> rewrites."""
    view = GraphView(model)
    done = {r.NAME: n for r in FP16_RULES if r.NAME in rules and (n := r.apply(view, {}))}
    if done:
        del model.graph.value_info[:]
    return done


def _rules(only: Collection[str] | None) -> tuple[Any, ...]:
    return RULES if only is None else tuple(r for r in RULES if r.NAME in only)

