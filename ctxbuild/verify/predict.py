"""Which precision-search candidates cannot pass, told before they are compiled: the rules the ladder walk
(verify/ladder.py) applies from what is already measured, so a model where nothing passes does not pay a
compile and a simulator run for every candidate. Both rules compare SNR per part: each output and each
slice of a concatenated output (verify/slices.py), as the verdict does (measure.failures).

- The CPU screen bounds the HTP: the simulator runs the QDQ model's math with its own rounding and came out
  at most `CPU_MARGIN_DB` above the CPU EP's run of the same QDQ model (measured: docs/measured.md,
  "Precision search"), so a candidate whose CPU run misses the thresholds by more than that is skipped.
- An HTP loss carries over to the candidates that differ from a failed one in their weights only (same
  activations, calibration and per-node settings): where the simulator fell short of the CPU run of the same
  QDQ model, another weight quantization recovered at most `HTP_RECOVERY_DB` of the shortfall (measured on
  the same models), so its own CPU figure minus the shortfall plus that bound must still reach the threshold.
  A run stopped early counts with the SNR its proof bounds over all samples: the shortfall is at least that.

- A failure on a sibling SoC carries over: the targets of one recipe compile the same QDQ model with the same
  toolchain, and the simulators of v73, v75 and v79 measured the same figures for every candidate both ran
  (docs/measured.md, "Sibling SoCs"). A candidate that failed on an earlier target's simulator is skipped on the
  later ones; what ships is still verified on its own SoC. When a later target's own run of a candidate
  disagrees with the sibling's (another verdict, or the worst SNR more than `SIBLING_TOLERANCE_DB` apart), the
  rule is off from that candidate on, and the candidates it skipped before are named in a warning (they cannot
  run in the same build: their gates closed before the disagreement was measured).

The constants are parameters of the gates (plan/search.py puts them in the search_step and select params):
changing one re-decides, it never leaves a stale gate.
"""
from __future__ import annotations

from typing import Any, Iterator

from ctxbuild.digests import canonical_json
from ctxbuild.verify.gates import is_skipped
from ctxbuild.verify.measure import failures

# The simulator above the CPU EP on the same QDQ model: at most +1.6 dB measured (tiny_cnn w8a16-pc; PP-OCR and
# the detectors +0.6 dB), -22 dB at the other end. The margin covers the largest "above" with room.
CPU_MARGIN_DB = 2.5
# Of an HTP shortfall (simulator minus CPU, same QDQ model), how much another weight quantization won back: at
# most 6.1 dB measured (the PP-OCR classifier, w8a16 -5.9 dB -> w8a16-pc +0.2 dB); w16a16 always lost more.
HTP_RECOVERY_DB = 10.0
# Two SoCs' simulators agree on a candidate when their worst SNRs are this close (and their verdicts equal):
# measured 0.000 dB apart on every candidate both ran (v73/v75/v79, docs/measured.md).
SIBLING_TOLERANCE_DB = 0.5
# Settings that make a candidate a weights-only variant of another (recipes/quantization.settings' keys).
WEIGHT_SETTINGS = frozenset({"name", "weights", "per_channel", "weight_symmetric"})


def rules(quantization: list[dict[str, Any]]) -> dict[str, Any]:
    """The prediction parameters for a ladder: the margins and each integer candidate's weights-only group."""
    groups = {s["name"]: canonical_json({k: v for k, v in s.items() if k not in WEIGHT_SETTINGS}).decode()
              for s in quantization if "precision" not in s}
    return {"cpu_margin_db": CPU_MARGIN_DB, "htp_recovery_db": HTP_RECOVERY_DB, "weight_variants": groups,
            "sibling_tolerance_db": SIBLING_TOLERANCE_DB}


def parts(result: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, metrics) for every output and every measured slice of a result."""
    for o, m in result.get("outputs", {}).items():
        yield f"output '{o}'", m
        for s in m.get("slices") or []:
            yield f"output '{o}' slice {s['start']}:{s['stop']} ({s['slice']})", s


def cpu_rejection(screen: dict[str, Any], thr: dict[str, float], margin_db: float) -> str | None:
    """Why the CPU screen rejects a candidate, or None. The cosine bar moves with the same margin: for small
    errors 1 - cosine scales as the error power, i.e. as 10^(-SNR/10). A candidate that could not be quantized
    or that onnxruntime cannot run is rejected with the screen's reason."""
    if error := screen.get("error"):
        return f"skipped: {error}"
    snr_bar = thr["min_snr_db"] - margin_db
    cos_bar = 1 - (1 - thr["min_cosine"]) * 10 ** (margin_db / 10)
    short = [(m["snr_db"], m["cosine"], where) for where, m in parts(screen)
             if not (m["snr_db"] >= snr_bar and m["cosine"] >= cos_bar)]
    if not short:
        return None
    snr, cos, where = min(short)
    return (f"skipped: CPU screen {snr:.1f} dB, cosine {cos:.4f} at {where} < {thr['min_snr_db']:g} dB, "
            f"{thr['min_cosine']:g} - {margin_db:g} dB margin")


def carried_htp_loss(name: str, earlier: list[str], screens: dict[str, Any], verifies: dict[str, Any],
                     thr: dict[str, float], predict: dict[str, Any], sources: dict[str, str] | None = None
                     ) -> tuple[str, str] | None:
    """(the variant, why) when an HTP loss measured on an earlier weights-only variant of `name` leaves it no
    chance, or None. A complete simulator run counts with its figures, an early-stopped one with the SNR its
    proof bounds over all samples (`htp_ceiling`). `sources`: the variants measured on a sibling SoC -> that
    SoC (named in the reason)."""
    groups = predict.get("weight_variants", {})
    mine = screens.get(name)
    if name not in groups or not mine or mine.get("error"):
        return None
    own = dict(parts(mine))
    for a in earlier:
        v, s = verifies.get(a), screens.get(a)
        if groups.get(a) != groups[name] or not v or not s or v.get("compile_refused"):
            continue
        cpu = dict(parts(s))
        for where, snr in htp_ceiling(v).items():
            if where not in cpu or where not in own:
                continue
            shortfall = cpu[where]["snr_db"] - snr
            best = own[where]["snr_db"] - shortfall + predict["htp_recovery_db"]
            if best < thr["min_snr_db"]:
                on = f" ({(sources or {})[a]}'s measurement)" if a in (sources or {}) else ""
                at_least = " at least" if "early_stop" in v else ""
                return a, (f"skipped: {a} lost{at_least} {shortfall:.1f} dB on the HTP{on} against its CPU run at "
                           f"{where}; {predict['htp_recovery_db']:g} dB of that back would still leave {name} at "
                           f"{best:.1f} dB < {thr['min_snr_db']:g} dB")
    return None


def int16_weights_fail_on_htp(verifies: dict[str, Any], screens: dict[str, Any],
                              settings: dict[str, dict[str, Any]], thr: dict[str, float]) -> str | None:
    """Why 16-bit weights are no fix on this model's HTP, or None: a candidate with 16-bit weights whose QDQ
    model passes on the CPU (its screen) and which the simulator measured failing (a complete run's figures, an
    early-stopped one's proven ceiling) at the same part. The mixed rung then keeps its nodes in fp16 instead
    (measured: PP-PicoDet's layout detector at w16a16, 31.4 dB on the CPU and at most 14.1 dB on the HTP; the
    mixed candidate with 25 nodes at 16-bit weights read 26.5 dB on the CPU and 8.9 dB on the simulator)."""
    for name, v in verifies.items():
        s = screens.get(name)
        if settings.get(name, {}).get("weights") != "int16" or not measured(v) or not s or s.get("error"):
            continue
        cpu = dict(parts(s))
        for where, snr in htp_ceiling(v).items():
            if where in cpu and cpu[where]["snr_db"] >= thr["min_snr_db"] > snr:
                at_most = "at most " if "early_stop" in v else ""
                return (f"{name}'s QDQ model passes on the CPU ({cpu[where]['snr_db']:.1f} dB at {where}) and reads "
                        f"{at_most}{snr:.1f} dB on the HTP: 16-bit weights are no fix here, the kept nodes run in fp16")
    return None


def htp_ceiling(v: dict[str, Any]) -> dict[str, float]:
    """where -> the highest SNR a simulator run can have over all its samples: a complete run's figures; for an
    early-stopped one, the bounds its proof recorded (verify/early_stop.py; the figures over the samples it ran
    bound nothing), for the parts whose labels its figures name. Results from before the bounds were recorded:
    nothing."""
    if "early_stop" not in v:
        return {where: m["snr_db"] for where, m in parts(v)}
    labels = {(o, s["start"], s["stop"]): s["slice"] for o, m in v.get("outputs", {}).items() for s in m.get("slices") or []}
    found = {}
    for b in v["early_stop"].get("bounds", []):
        if b["snr_db"] is None:  # no error yet on that part: no bound
            continue
        if "start" not in b:
            found[f"output '{b['output']}'"] = b["snr_db"]
        elif (label := labels.get((b["output"], b["start"], b["stop"]))) is not None:
            found[f"output '{b['output']}' slice {b['start']}:{b['stop']} ({label})"] = b["snr_db"]
    return found


def measured(v: dict[str, Any] | None) -> bool:
    """A simulator run's figures (complete or stopped early): not a placeholder, not a refusal."""
    return bool(v) and not is_skipped(v) and not v.get("compile_refused") and bool(v.get("outputs"))


def worst_snr(result: dict[str, Any]) -> tuple[float, str]:
    """The lowest SNR over every output and slice, and where."""
    return min((m["snr_db"], where) for where, m in parts(result))


def sibling_failure(name: str, siblings: dict[str, dict[str, Any]], thr: dict[str, float]) -> tuple[str, str] | None:
    """(sibling, why) when an earlier target of the recipe (`siblings`: target -> its verifies) measured `name`
    failing on its simulator, or None. An early-stopped run counts: its stop is a proof that it fails."""
    for soc, verifies in siblings.items():
        v = verifies.get(name)
        if measured(v) and failures({**v, "thresholds": thr}):
            snr, where = worst_snr(v)
            cut = f" (stopped early: {v['early_stop']['proof']})" if "early_stop" in v else ""
            return soc, (f"skipped: failed on {soc}'s simulator, SNR {snr:.1f} dB at {where} < {thr['min_snr_db']:g} "
                         f"dB{cut}; the sibling SoCs' simulators agree (predicted from {soc}'s measurement)")
    return None


def sibling_disagreement(name: str, mine: dict[str, Any], siblings: dict[str, dict[str, Any]], thr: dict[str, float],
                         tolerance_db: float) -> str | None:
    """How this target's own run of `name` contradicts a sibling's run of it, or None. Figures are compared only
    between complete runs (an early-stopped one covers some samples); verdicts always."""
    for soc, verifies in siblings.items():
        v = verifies.get(name)
        if not measured(v) or not measured(mine):
            continue
        here, there = not failures({**mine, "thresholds": thr}), not failures({**v, "thresholds": thr})
        (a, _), (b, _) = worst_snr(mine), worst_snr(v)
        complete = "early_stop" not in mine and "early_stop" not in v
        if here != there or complete and abs(a - b) > tolerance_db:
            return (f"{name} {'passed' if here else 'failed'} here at {a:.1f} dB where {soc}'s simulator "
                    f"{'passed' if there else 'failed'} it at {b:.1f} dB")
    return None
