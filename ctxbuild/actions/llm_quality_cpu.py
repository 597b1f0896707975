"""llm_quality_cpu: the QDQ parts of an `llm:` recipe on the CPU EP against the float export (ctxbuild/llm/quality.py):
perplexity of the whole evaluation text, teacher-forced greedy agreement on every verification prompt, and each
prompt's own greedy text. Once per recipe: the QDQ graphs are the same for every target; each target's llm_quality
reads the result and gates it with its simulator figures. Where the figures fail a quality gate, the same chain
again with the activations in float (llm/weights_alone.py), so the report says which side costs the model."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.llm.layout import Layout
from ctxbuild.plan.action import Action


def summarize(action: Action) -> dict[str, Any]:
    r = json.loads(Path(action.outputs["result"]).read_text())
    return {"ppl_ratio": r["ppl_ratio"], "agreement": r["agreement"]}


def run(ctx: Any) -> None:
    from ctxbuild.llm import quality
    from ctxbuild.llm.ar_sessions import one_ar_runner
    from ctxbuild.lora.adapters import slot_defaults_of

    a, p = ctx.action, ctx.action.params
    layout = Layout.read(Path(a.inputs["layout"]))
    floats = json.loads(Path(a.inputs["float"]).read_text())
    cl, ar = p["context_length"], max(g.ar for g in layout.graphs)
    # LoRA slots (llm.adapters) are required inputs of the QDQ graphs: fed their defaults, as the wrappers hold them
    bound = {k: slot_defaults_of(path) for k, path in layout.models("reference", a.inputs, cl).items()} \
        if any(r.startswith("reference:") for r in a.inputs) else None
    run_ = one_ar_runner(layout.models("qdq", a.inputs, cl), bound)  # one AR's sessions at a time (llm/ar_sessions.py)
    result = quality.measure(run_, layout.parts, (layout.kv_heads, layout.head_dim), floats, cl, ar, free=True)
    if not quality.meets(result, p["thresholds"]) and not bound:
        from ctxbuild.llm.weights_alone import SESSION_CONFIG, weights_alone

        run_ = None  # the QDQ graphs' InferenceSessions go: one set held at a time
        alone = one_ar_runner(weights_alone(layout.models("qdq", a.inputs, cl), ctx.tmp / "weights_alone"),
                              config=SESSION_CONFIG)
        m = quality.measure(alone, layout.parts, (layout.kv_heads, layout.head_dim), floats, cl, ar)
        result["weights_alone"] = {k: m[k] for k in ("ppl_ratio", "agreement", "tokens", "steps")}
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=1))
