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

The constants are parameters of the gates (plan/search.py puts them in the search_step and select params):
changing one re-decides, it never leaves a stale gate.
"""
from __future__ import annotations

from typing import Any, Iterator

from ctxbuild.digests import canonical_json

# The simulator above the CPU EP on the same QDQ model: at most +1.6 dB measured (tiny_cnn a16w8-pc; PP-OCR and
# the detectors +0.6 dB), -22 dB at the other end. The margin covers the largest "above" with room.
CPU_MARGIN_DB = 2.5
# Of an HTP shortfall (simulator minus CPU, same QDQ model), how much another weight quantization won back: at
# most 6.1 dB measured (the PP-OCR classifier, a16w8 -5.9 dB -> a16w8-pc +0.2 dB); a16w16 always lost more.
HTP_RECOVERY_DB = 10.0
# Settings that make a candidate a weights-only variant of another (recipes/quantization.settings' keys).
WEIGHT_SETTINGS = frozenset({"name", "weights", "per_channel", "weight_symmetric"})


def rules(quantization: list[dict[str, Any]]) -> dict[str, Any]:
    """The prediction parameters for a ladder: the margins and each integer candidate's weights-only group."""
    groups = {s["name"]: canonical_json({k: v for k, v in s.items() if k not in WEIGHT_SETTINGS}).decode()
              for s in quantization if "precision" not in s}
    return {"cpu_margin_db": CPU_MARGIN_DB, "htp_recovery_db": HTP_RECOVERY_DB, "weight_variants": groups}


def parts(result: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, metrics) for every output and every measured slice of a result."""
    for o, m in result.get("outputs", {}).items():
        yield f"output '{o}'", m
        for s in m.get("slices") or []:
            yield f"output '{o}' slice {s['start']}:{s['stop']} ({s['slice']})", s


def cpu_rejection(screen: dict[str, Any], thr: dict[str, float], margin_db: float) -> str | None:
    """Why the CPU screen rejects a candidate, or None. The cosine bar moves with the same margin: for small
    errors 1 - cosine scales as the error power, i.e. as 10^(-SNR/10). A candidate onnxruntime cannot run is
    rejected with onnxruntime's reason."""
    if error := screen.get("error"):
        return f"skipped: onnxruntime's CPU EP cannot run its QDQ model ({error})"
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
                     thr: dict[str, float], predict: dict[str, Any]) -> str | None:
    """Why an HTP loss measured on an earlier weights-only variant of `name` leaves it no chance, or None.
    Only a completed simulator run counts (an early-stopped one has figures over some samples)."""
    groups = predict.get("weight_variants", {})
    mine = screens.get(name)
    if name not in groups or not mine or mine.get("error"):
        return None
    own = dict(parts(mine))
    for a in earlier:
        v, s = verifies.get(a), screens.get(a)
        if groups.get(a) != groups[name] or not v or not s or "early_stop" in v or v.get("compile_refused"):
            continue
        cpu = dict(parts(s))
        for where, m in parts(v):
            if where not in cpu or where not in own:
                continue
            shortfall = cpu[where]["snr_db"] - m["snr_db"]
            best = own[where]["snr_db"] - shortfall + predict["htp_recovery_db"]
            if best < thr["min_snr_db"]:
                return (f"skipped: {a} lost {shortfall:.1f} dB on the HTP against its CPU run at {where}; "
                        f"{predict['htp_recovery_db']:g} dB of that back would still leave {name} at "
                        f"{best:.1f} dB < {thr['min_snr_db']:g} dB")
    return None
