"""Which nodes a mixed-precision candidate keeps at higher precision, from the per-node diagnosis
(diagnose.py) of a failed quantization candidate.

Where the HTP itself loses what the QDQ model keeps on the CPU (an HTP-only loss), the nodes whose added noise
on the HTP is worst are left out of quantization (`fp16`: the HTP runs them in fp16 between the quantized
nodes), worst first, until what the others add would leave the output clear (blamed_on_htp). Where
quantization loses it, the worst nodes get 16-bit weights when they have weights the base candidate holds in
8 bits, else `fp16` too. The answer is a `quantization.nodes` mapping of the user's
model's node names (the diagnosis' rows name a node prepare rewrote by the user's node it replaced:
graph/nodenames.py), a fused group (Conv+Relu) named node by node. An HTP-only loss gets one line as well
(htp_only): the growing rounds (grow.py) measure on the CPU and cannot see it, so the line names the nodes the
diagnosis blames on the HTP and the field that pins them.
"""
from __future__ import annotations

from typing import Any

from ctxbuild.graph.nodenames import Names, key
from ctxbuild.recipes.quantization import FP16_NODE
from ctxbuild.verify.grow import worst
from ctxbuild.verify.layerloss import noise

MAX_NODES = 8  # at most this many blamed nodes (each with its fused group)
# A node is blamed in quantization when the noise it adds alone is within this many dB of the worst node's: the
# few that dominate, not the long tail every quantized node adds.
WITHIN_DB = 10.0


def blamed_in_quantization(rows: list[dict[str, Any]], min_snr_db: float) -> list[dict[str, Any]]:
    """The diagnosis rows (worst first) whose own quantization noise is near the worst and above what the
    thresholds allow (a node adding less noise than -min_snr_db cannot be why the output misses min_snr_db);
    the growing rounds (grow.py) measure what they leave."""
    ranked = [r for r in rows if r.get("quant_added_db") is not None]
    if not ranked:
        return []
    floor = max(max(r["quant_added_db"] for r in ranked) - WITHIN_DB, -min_snr_db)
    return [r for r in ranked if r["quant_added_db"] >= floor][:MAX_NODES]


def blamed_on_htp(diagnosis: dict[str, Any], margin_db: float) -> list[dict[str, Any]]:
    """The HTP's culprits: its worst nodes (at most MAX_NODES), worst first, until the noise power the other
    nodes add on the HTP (diagnosis["htp_noise_added"] less the taken ones') fits beside the quantization
    noise the CPU measured at the output within min_snr_db + `margin_db` (the CPU screen's margin). No single
    node need fail the threshold: on PP-OCR's detector the HTP loses the output through a bias Add and the
    Sigmoid after it, each under it alone.

    The rest is the others' own noise, not the output's less the taken nodes': a node's added noise can be its
    input's amplified (a Sigmoid over saturated scores), which stays when that node runs in fp16. For the same
    reason no window below the worst node bounds the set: an amplifier's figure can sit far above the nodes
    making the loss (a DB head's Sigmoid at +2.6 dB, the bias Add feeding it at -19.8 dB)."""
    rows = [r for r in diagnosis["worst_htp"] if r.get("htp_added_db") is not None]
    cpu = min(row["quantization"]["snr_db"] for row in diagnosis["outputs"].values())
    allowed = noise(diagnosis["thresholds"]["min_snr_db"] + margin_db) - noise(cpu)
    rest = diagnosis["htp_noise_added"]
    taken: list[dict[str, Any]] = []
    for r in rows[:MAX_NODES]:
        if rest <= allowed:
            break
        taken.append(r)
        rest -= noise(-r["htp_added_db"])
    return taken


def weak_ends(diagnosis: dict[str, Any], ends: dict[str, str]) -> list[str]:
    """The nodes computing outputs that pass whole but fail in a slice where the loss is (a score slice of a
    concatenated output): the per-node figures are of whole tensors and cannot see it, the output's own
    quantization (one scale over both parts) loses it. `ends`: output -> the node computing it."""
    t, side = diagnosis["thresholds"], "htp" if diagnosis["where"] == "htp" else "quantization"

    def passes(m: dict[str, Any]) -> bool:
        return m["cosine"] >= t["min_cosine"] and m["snr_db"] >= t["min_snr_db"]

    return [ends[o] for o, row in diagnosis["outputs"].items() if o in ends and side in row
            and not all(passes(s) for s in row[side].get("slices") or [])]


def node_overrides(diagnosis: dict[str, Any], base: dict[str, Any], ends: dict[str, str], *,
                   int16_weights: bool, margin_db: float) -> dict[str, Any]:
    """quantization.nodes for the mixed candidate on top of `base`'s (its settings). `ends`: output -> the
    node computing it; `int16_weights`: the target runs 16-bit weights (recipes/quantization.problem);
    `margin_db`: the CPU screen's, which an HTP-only loss's blame leaves the output (blamed_on_htp)."""
    htp = diagnosis["where"] == "htp"
    rows = (blamed_on_htp(diagnosis, margin_db) if htp else
            blamed_in_quantization(diagnosis["worst_quantization"], diagnosis["thresholds"]["min_snr_db"]))
    wide = not htp and int16_weights and base["weights"] != "int16" and base["activations"] == "uint16"
    nodes = dict(base["nodes"])
    for r in rows:
        if wide and r.get("weight_snr_db") is not None:  # coarse weights: 16-bit ones, the rest stays quantized
            nodes[r["node"]] = {"weights": "int16"}
            continue
        for name in [r["node"], *r["fused"]]:
            nodes[name] = FP16_NODE
    for name in weak_ends(diagnosis, ends):
        nodes[name] = FP16_NODE
    return dict(sorted(nodes.items()))


def lone_pins(model: Any, nodes: dict[str, Any]) -> list[str]:
    """The fp16 pins of `nodes` (the user's names) that would change nothing in `model` (the prepared model): every
    node a pin stands for is weightless (no float initializer), reads only tensors quantized nodes compute (or graph
    inputs a quantized node reads too) and writes only tensors quantized nodes alone read (no graph output). The
    quantizer then puts a DequantizeLinear before and a QuantizeLinear after it, which QNN runs as one quantized op
    (actions/quantize.runs_quantized finds the same in the QDQ model): the binary is the unpinned one to the byte.
    Where a neighbour is an op the quantizer leaves in float this says lone too: pinning one more node costs little."""
    g = _Graph(model, nodes)
    return [pin for pin, found in g.fp16.items() if found and all(g.quantized_between(k) for k in found)]


def widen_lone(model: Any, nodes: dict[str, Any], worst: list[dict[str, Any]], side: str) -> tuple[dict[str, Any],
                                                                                                 dict[str, str]]:
    """(quantization.nodes, {lone pin: the neighbour pinned with it}): each fp16 pin that would change nothing
    (lone_pins) gets a neighbour in fp16 too, so the tensor between them stays float and the HTP runs both in fp16:
    the neighbour the diagnosis' rows (`worst`, by `side`'s added dB) rate worst, else the node computing its first
    input (a node's noise is mostly its input's, amplified). Without it the mixed candidate would be the base to the
    byte, and a verify would measure the base again (PP-OCR's direction classifier: a lone HardSigmoid)."""
    rank = {r["node"]: r[side] for r in worst if r.get(side) is not None}
    nodes, widened = dict(nodes), {}
    for pin in lone_pins(model, nodes):
        g = _Graph(model, nodes)  # with the neighbours pinned so far
        if not all(g.quantized_between(k) for k in g.fp16[pin]):
            continue  # an earlier pin's neighbour is this one's too
        near = [n for k in g.fp16[pin] for n in g.neighbours(k) if n not in nodes]
        if near:
            pick = max(near, key=lambda n: rank.get(n, float("-inf"))) if any(n in rank for n in near) else near[0]
            nodes[pick] = FP16_NODE
            widened[pin] = pick
    return dict(sorted(nodes.items())), widened


class _Graph:
    """The prepared model's tensors around the nodes `nodes`' fp16 pins stand for (by nodenames.key)."""

    def __init__(self, model: Any, nodes: dict[str, Any]) -> None:
        import onnx

        self.names = Names(model)
        self.fp16 = {n: self.names.resolve(n) or [] for n, o in nodes.items() if o == FP16_NODE}
        self.floated = {k for found in self.fp16.values() for k in found}
        g = model.graph
        self.by_key = {key(n): n for n in g.node}
        self.producer = {o: key(n) for n in g.node for o in n.output}
        self.readers: dict[str, list[str]] = {}
        for n in g.node:
            for t in n.input:
                self.readers.setdefault(t, []).append(key(n))
        self.inits = {i.name: i.data_type for i in g.initializer}
        self.float_init = {t for t, dt in self.inits.items() if dt == onnx.TensorProto.FLOAT}
        self.inputs = {i.name for i in g.input}
        self.outputs = {o.name for o in g.output}

    def quantized_between(self, k: str) -> bool:
        """Node `k` would sit between a DequantizeLinear on each input and QuantizeLinear nodes alone on each output."""
        node = self.by_key.get(k)
        if node is None:
            return False
        for t in filter(None, node.input):
            if t in self.float_init:
                return False  # its own float weight stays float: it runs in fp16
            if t in self.inits:
                continue
            # a graph input is quantized when a quantized node reads it too; else what computes it must be quantized
            quantized = (any(r not in self.floated for r in self.readers[t]) if t in self.inputs
                         else t in self.producer and self.producer[t] not in self.floated)
            if not quantized:
                return False
        return all(o not in self.outputs and self.readers.get(o) and not set(self.readers[o]) & self.floated
                   for o in filter(None, node.output))

    def neighbours(self, k: str) -> list[str]:
        """The user's names of the nodes computing `k`'s inputs, then of those reading its outputs."""
        node = self.by_key[k]
        up = [self.producer[t] for t in node.input if t in self.producer]
        down = [r for o in node.output for r in self.readers.get(o, [])]
        return list(dict.fromkeys(self.names.user(n) for n in up + down))


def htp_only(diagnosis: dict[str, Any], base: str, margin_db: float, screen: dict[str, Any] | None = None,
             simulated: dict[str, Any] | None = None, widened: dict[str, str] | None = None) -> str | None:
    """One line for a loss the HTP makes alone (the base's QDQ model passes on the CPU), or None: its figures on
    both sides, the nodes the mixed candidate pins for it (blamed_on_htp, worst first; the worst nodes when the
    HTP's own noise alone would leave the output clear) and how to pin them, since no round measured on the CPU
    can grow the set for it. `screen`, `simulated`: the base's CPU screen and simulator run over every
    verification sample, whose figures the line quotes where given (the diagnosis' few samples can read both
    sides above the thresholds while the whole run fails). `widened`: the neighbours lone pins take along
    (widen_lone), named after the blamed nodes."""
    if diagnosis["where"] != "htp" or not diagnosis["worst_htp"]:
        return None
    sides = {k: {"outputs": {o: row[k] for o, row in diagnosis["outputs"].items() if k in row}}
             for k in ("quantization", "total")}
    cpu = worst(screen if screen and screen.get("outputs") else sides["quantization"])
    sim = worst(simulated) if simulated and simulated.get("outputs") else (
        worst(sides["total"]) if sides["total"]["outputs"] else None)
    names = [r["node"] for r in blamed_on_htp(diagnosis, margin_db) or diagnosis["worst_htp"][:MAX_NODES]]
    names += [n for n in dict.fromkeys((widened or {}).values()) if n not in names]
    return (f"the loss is on the HTP only ({base}'s QDQ model on the CPU {cpu['snr_db']} dB at {cpu['where']}"
            + (f", on the simulator {sim['snr_db']} dB at {sim['where']}" if sim else "")
            + f"): the mixed rung's rounds measure on the CPU and cannot grow for it; the diagnosis blames "
            f"{', '.join(names)}: pin them in float with quantization.nodes ({{{names[0]}: fp16, ...}})")
