"""llm_quality: an `llm:` recipe's quality gates for one target (ctxbuild/llm/quality.py): the perplexity of the
evaluation text and the greedy agreement with the float export, measured on the QDQ parts on the CPU (llm_quality_cpu:
the whole text, every prompt) and on the compiled parts on the HTP simulator (single-graph twins of the largest
context length, chained as a device runs them, the KV cache carried; a stated subset, as the simulator is slow).
The build fails (exit 1) when a backend's perplexity ratio passes `llm.max_ppl_ratio` or its agreement falls under
`llm.min_agreement`. The result holds the figures and, per prompt, the float export's and the QDQ parts' generated text
side by side. The bundles are inputs: a changed deliverable re-verifies."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.actions.llm_eval import in_simulator
from ctxbuild.actions.llm_part_eval import SUBSET_ABOVE
from ctxbuild.errors import ActionError, cause_line
from ctxbuild.llm import quality
from ctxbuild.llm.layout import Layout
from ctxbuild.plan.action import Action
from ctxbuild.recipes.llm import SIMULATOR_SUBSET, SIMULATOR_SUBSET_LARGE

METHOD = ("perplexity of the evaluation text and top-1 agreement with the float export's greedy tokens (teacher-forced): "
          "the QDQ parts on the CPU over all of it, the compiled parts on the HTP simulator over the text's first {windows} "
          "window(s) of the largest AR, {prompts} prompt(s) and {tokens} token(s) each")
BACKENDS = {"qdq_cpu": "QDQ parts on the CPU", "simulator": "compiled parts on the simulator"}


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text())}


def run(ctx: Any) -> None:
    a, p = ctx.action, ctx.action.params
    layout = Layout.read(Path(a.inputs["layout"]))
    floats = json.loads(Path(a.inputs["float"]).read_text())
    cl, ar = p["context_length"], max(g.ar for g in layout.graphs)
    measured: dict[str, dict[str, Any]] = {}
    if "cpu" in a.inputs:  # fp16 compiles the float graphs: no QDQ graph
        measured["qdq_cpu"] = json.loads(Path(a.inputs["cpu"]).read_text())
    twins = layout.models("twin", a.inputs, cl)
    subset = simulator_subset(a.inputs, p["subset"])
    lost = None  # the simulator's failure (a timeout on a loaded machine): the CPU's figures are kept all the same
    try:
        measured["simulator"] = in_simulator(_child, (layout, twins, floats, cl, ar, subset), cl, p["timeout_s"])
    except ActionError as e:
        lost = f"{BACKENDS['simulator']}: {e}"
    result = report({**p, "subset": subset}, floats, measured, Path(a.inputs["tokenizer"]) if "tokenizer" in a.inputs else None)
    if lost:
        result["failures"].append(lost)
        result["passed"] = False
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    if result["failures"]:
        raise ActionError(f"{a.recipes[0]}@{a.target['name']}: " + "; ".join(result["failures"]),
                          hint(measured.get("qdq_cpu", {}).get("weights_alone"), p["thresholds"]), details=result)


def hint(alone: dict[str, Any] | None, t: dict[str, float]) -> str:
    """What to try, from the QDQ parts' figures with the activations in float (llm_quality_cpu) where measured."""
    gates = "or set llm.max_ppl_ratio / llm.min_agreement to what the model may lose (docs/llm-reference.md, Quality)"
    if alone is None:
        return f"try precision w8a16, more calibration prompts, {gates}"
    figures = f"with the activations in float the QDQ parts read {alone['ppl_ratio']:.3f}x, agreement {alone['agreement']:.2f}"
    if not quality.meets(alone, t):
        return f"{figures}: the weights lose the model; try precision w8a16 or llm.quantization's settings, {gates}"
    return (f"{figures}: the weights keep the model and the uint16 activations lose it; try more or longer "
            f"calibration prompts, {gates}")


def simulator_subset(inputs: dict[str, str], given: dict[str, int]) -> dict[str, int]:
    """llm.eval.simulator over its defaults, which the largest part's QDQ weight file chooses (recipes/llm.py)."""
    largest = max((Path(v).stat().st_size for k, v in inputs.items() if k.startswith("qdq:") and k.endswith(".data")),
                  default=0)
    return {**(SIMULATOR_SUBSET_LARGE if largest > SUBSET_ABOVE else SIMULATOR_SUBSET), **given}


def report(p: dict[str, Any], floats: dict[str, Any], measured: dict[str, dict[str, Any]], tokenizer: Path | None
           ) -> dict[str, Any]:
    """The result: figures per backend, the gates' failures, the texts side by side (the float export's and the QDQ
    parts' own greedy continuation, or the simulator's first divergence where there is no QDQ graph)."""
    t = p["thresholds"]
    figures = {b: {k: v for k, v in m.items() if k != "generated"} for b, m in measured.items()}
    texts = []
    cpu = measured.get("qdq_cpu", {})
    for i, f in enumerate(floats["prompts"]):
        row = {"prompt": f["prompt"], "float": f["text"], "float_tokens": len(f["tokens"])}
        if "generated" in cpu:  # as text, or as ids without a tokenizer
            row["qdq_cpu"] = quality.decode(tokenizer, cpu["generated"][i]) or cpu["generated"][i]
        for b, m in measured.items():
            if i < len(m["first_divergence"]):
                row[f"first_divergence_{b}"] = m["first_divergence"][i]
        texts.append(row)
    failures = quality.failures({BACKENDS[b]: m for b, m in figures.items()}, t)
    return {"graph": "quality", "method": METHOD.format(**p["subset"]), "thresholds": t,
            "precision": p["precision"], "quality": {"float": {"ppl": floats["ppl"], "text": floats["text"]["source"],
                                                               "tokens": floats["text"]["tokens"]},
                                                     **figures, "texts": texts},
            "outputs": {}, "failures": failures, "passed": not failures}


def _child(layout: Layout, twins: dict[tuple[int, int, int], Path], floats: dict[str, Any], cl: int, ar: int,
           subset: dict[str, int], send: Any) -> None:
    import onnxruntime as ort

    from ctxbuild.toolchain import installed as toolchain

    try:
        sessions: dict[tuple[int, int, int], Any] = {}

        def run(part: int, ar_: int, cl_: int, feeds: dict[str, Any]) -> dict[str, Any]:
            key = (part, ar_, cl_)
            if key not in sessions:
                sessions[key] = ort.InferenceSession(str(twins[key]), toolchain.session_options({}, cpu_fallback=False))
            s = sessions[key]
            return dict(zip([o.name for o in s.get_outputs()], s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})))

        send.send(quality.measure(run, layout.parts, (layout.kv_heads, layout.head_dim), floats, cl, ar, subset))
    except Exception as e:  # noqa: BLE001 - ORT's message to the parent as one line
        send.send(cause_line(e, last=True))
