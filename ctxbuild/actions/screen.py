"""screen: a precision-search candidate's QDQ model on the CPU EP against the float model, on the
verification samples (milliseconds a sample, against seconds on the HTP simulator), per output and per slice
of a concatenated output as verify measures them. `search_step` skips a candidate that already misses the
thresholds here by more than the margin, before it is compiled (verify/predict.py). Like a candidate verify it
only measures; the thresholds are not in its key."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError, cause_line
from ctxbuild.graph.modelio import load
from ctxbuild.actions import verify
from ctxbuild.actions.quantize import static_refusal
from ctxbuild.graph.inputvalues import recorded
from ctxbuild.graph.samples import for_verification, input_spec
from ctxbuild.plan.action import Action
from ctxbuild.verify import gates
from ctxbuild.verify import slices as output_slices
from ctxbuild.verify.measure import compare, cpu_outputs, metrics
from ctxbuild.verify.memo import OutputsMemo, float_reference


discover_inputs = verify.discover_inputs  # the same samples as the candidate's verify: its declared dir


def run(ctx: Any) -> None:
    a = ctx.action
    p = a.params
    if gates.closed(a.inputs):
        gates.write_skipped(ctx)
        return
    ref_model = Path(a.inputs["reference"])
    ref_proto = load(ref_model, external_data=False)
    spec = input_spec(ref_proto)
    samples = for_verification(spec, p, lambda: verify.sample_files(a), a.recipe_files[0], recorded(ref_proto))
    if refused := static_refusal(ref_proto):  # its quantize dropped out: nothing to run
        result = {"samples": len(samples), "outputs": {}, "error": f"no static quantization of this export: {refused}"}
        ctx.tmp_output("result").write_text(json.dumps(result, indent=2, sort_keys=True))
        return
    memo = OutputsMemo(ctx.cache, ctx.tmp)
    reference, _ = float_reference(ctx, samples, memo)  # the candidates' verifies share the memo entry
    start = time.monotonic()
    try:
        got = cpu_outputs(Path(a.inputs["model"]), samples)
        result = {"samples": len(samples), "outputs": compare(reference, got, Path(a.inputs["original"]))}
        output_slices.annotate(result["outputs"], ref_proto, p.get("slices"), reference, got, metrics)
    except (ActionError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime's exceptions are untyped: the candidate drops out, said why
        why = cause_line(e)
        print(f"candidate {a.id} dropped out: onnxruntime's CPU EP cannot run its QDQ model: {why}")
        result = {"samples": len(samples), "outputs": {}, "error": f"onnxruntime's CPU EP cannot run its QDQ model: {why}"}
    ctx.facts.update(qdq_cpu_seconds=round(time.monotonic() - start, 3), memo_hits=memo.hits, memo_keys=memo.keys)
    ctx.tmp_output("result").write_text(json.dumps(result, indent=2, sort_keys=True))


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text())}
