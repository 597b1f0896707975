"""Which toolchains need each legalization rule, measured: bench/legalize_toolchains.py builds a probe model per
rule (the pattern it rewrites, at the precision where the HTP refuses or miscomputes it) with the rule off, for
each published onnxruntime-qnn release, and verifies it on that release's simulator (docs/legalization.md has the
table). OFF holds what it measured: a release whose probe "passes" with the rule off handles the pattern itself,
and with `prepare.rewrite: true` (the default) the rule does not run for it. Every other release, and any release
or rule not in the table (a new rule, a new release), runs the rule: only a measurement takes a rule away.
A recipe that lists rules (`prepare.rewrite: [gelu]`) gets them whatever the toolchain."""
from __future__ import annotations

# rule -> onnxruntime-qnn release -> the probe built with the rule off: "refused" (QNN would not compile it),
# "fails (cosine C)" (it compiled and missed the verification thresholds) or "passes (cosine C)".
# Measured 2026-11-27 (SM8650, default thresholds); with the rule on every probe passes on every release.
MEASURED = ("2.3.0", "2.4.0", "2.5.0", "2.6.0", "2.7.0")
OFF: dict[str, dict[str, str]] = {
    "einsum": dict.fromkeys(MEASURED, "refused"),  # fp16, btgi,gih->btgh
    "gathernd": dict.fromkeys(MEASURED, "refused"),  # fp16, boolean data
    "clip": dict.fromkeys(MEASURED, "refused"),  # fp16 and int16, a runtime min (2.5.0's "Clip with quantized
    # min/max" is not this pattern)
    "dynamic_int8": dict.fromkeys(MEASURED, "refused"),  # fp16, quantize_dynamic's MatMulInteger and int8 Gather
    "rmsnorm": dict.fromkeys(MEASURED, "fails (cosine 0.994)"),  # fp16, squares past 65504
    "gelu": {**dict.fromkeys(MEASURED, "refused"),  # int16, int8: QAIRT 2.47 runs the quantized Erf, 2.48 on not
             "2.3.0": "passes (cosine 1.000)"},
    "mask_fill": dict.fromkeys(MEASURED, "fails (cosine 0.426)"),  # int16: the fill takes the logits' range
    "convtranspose": dict.fromkeys(MEASURED, "fails (cosine -0.104)"),  # fp16, grouped with output_padding
    "sum_squares": dict.fromkeys(MEASURED, "refused"),  # fp16: QNN has no ReduceSumSquare
    "log_power": {**dict.fromkeys(MEASURED, "fails (cosine 0.872)"),  # fp16, a log-mel with silence and quiet input
                  "2.3.0": "fails (cosine 0.930)"},
    "variance": dict.fromkeys(MEASURED, "fails (cosine 0.999)"),  # fp16, a sum of squares past 65504: SNR -87.6 dB
    "qdq_bias": {**dict.fromkeys(MEASURED, "passes (cosine 1.000)"),  # qdq: a float bias on a quantized Conv is
                 "2.6.0": "fails (cosine 0.556)", "2.7.0": "fails (cosine 0.556)"},  # miscomputed from QAIRT 2.50 on
}


def decide(rule: str, plugin: str) -> tuple[bool, str]:
    """Whether `rule` runs for onnxruntime-qnn `plugin`, and why (for the prepare record)."""
    off = OFF.get(rule, {}).get(plugin)
    if off is None:
        return True, f"runs: not measured for onnxruntime-qnn {plugin} (a rule runs unless measured unneeded)"
    if off.startswith("passes"):
        return False, f"skipped: onnxruntime-qnn {plugin} handles it (measured with the rule off: {off})"
    return True, f"needed by onnxruntime-qnn {plugin} (measured with the rule off: {off})"
