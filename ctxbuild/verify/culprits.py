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
