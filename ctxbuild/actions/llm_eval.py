"""llm_eval: token-level verification of an `llm:` recipe for one target.

Per context length and prompt: the float static graphs decode greedily on the CPU; the QDQ graphs (CPU EP) and
the compiled graphs (HTP simulator) are teacher-forced on those tokens (ctxbuild/llm/tokens.py). The simulator
cannot load multi-graph (weight-shared) binaries (QNN-NOTES), so it runs each graph's single-graph twin, compiled
from the same QDQ model with the same options; the bundles are inputs so any change re-verifies. The simulator
runs in a child process: a crash there is an error here, not a dead build.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError
from ctxbuild.llm.layout import Layout
from ctxbuild.llm.prompts import load_prompts, prompt_files
from ctxbuild.plan.action import Action

METHOD = "single-graph twins on the HTP simulator (it cannot load the weight-shared multi-graph binaries)"


def discover_inputs(action: Action) -> dict[str, Path]:
    return prompt_files(Path(action.watch[0]), action.params["prompts"])


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text())}


def run(ctx: Any) -> None:
    from ctxbuild.llm import pipeline, tokens

    a, p = ctx.action, ctx.action.params
    layout = Layout.read(Path(a.inputs["layout"]))
    prompts = load_prompts(discover_inputs(a))
    result: dict[str, Any] = {"graph": "tokens", "method": METHOD, "precision": p["precision"], "prompts": len(prompts),
                              "tokens_per_prompt": p["generate"], "thresholds": p["thresholds"], "by_cl": {},
                              "outputs": {}}
    failures = []
    for cl in sorted({g.cl for g in layout.graphs}):
        # sessions of one CL at a time: an LLM's graphs hold the weights once per graph
        ref = tokens.float_runs(layout, pipeline.cpu_runner(layout.models("reference", a.inputs, cl)), prompts,
                                p["generate"], cl)
        row: dict[str, Any] = {}
        if "qdq:" + layout.graphs[0].name in a.inputs:
            row["qdq_cpu"] = tokens.compare(ref, tokens.forced_logits(
                layout, pipeline.cpu_runner(layout.models("qdq", a.inputs, cl)), prompts, ref, cl))
        row["simulator"] = tokens.compare(ref, _simulate(layout, a.inputs, prompts, ref, cl, p["timeout_s"]))
        result["by_cl"][str(cl)] = row
        sim, t = row["simulator"], p["thresholds"]
        # the report's and the build summary's per-output view: the simulator's logits at this CL
        result["outputs"][f"logits@cl{cl}"] = {"cosine": sim["cosine_mean"], "snr_db": sim["sqnr_db"],
                                                "argmax_agreement": sim["token_agreement"]}
        if not (sim["token_agreement"] >= t["min_token_agreement"] and sim["cosine_mean"] >= t["min_cosine"]):
            failures.append(f"CL {cl}: top-1 agreement {sim['token_agreement']:.2f} (min {t['min_token_agreement']}), "
                            f"logits cosine {sim['cosine_mean']:.4f} (min {t['min_cosine']})")
    result["passed"] = not failures
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    if failures:
        raise ActionError(f"{a.recipes[0]}@{a.target['name']}: " + "; ".join(failures),
                          "try precision w8a16, kv_cache uint16, or more calibration prompts (docs/llm.md)")


def _simulate(layout: Layout, inputs: dict[str, str], prompts: list[Any], ref: list[Any], cl: int,
              timeout: float) -> list[Any]:
    from ctxbuild.verify.measure import in_child

    got, exitcode, hung = in_child(_child, (layout, layout.models("twin", inputs), prompts, ref, cl), timeout)
    if got is None:
        why = f"did not finish within {timeout:g} s" if hung else f"crashed (exit {exitcode})"
        raise ActionError(f"the HTP simulator {why} at CL {cl}",
                          "raise verify.timeout_s, or verify fewer prompts (llm.prompts.verify)")
    if isinstance(got, str):
        raise ActionError(f"the HTP simulator failed at CL {cl}: {got}")
    return got


def _child(layout: Layout, twins: dict[tuple[int, int, int], Path], prompts: list[Any], ref: list[Any], cl: int,
           send: Any) -> None:
    import onnxruntime as ort

    from ctxbuild.llm import tokens
    from ctxbuild.toolchain import installed as toolchain

    try:
        sessions: dict[tuple[int, int, int], Any] = {}

        def run(part: int, ar: int, cl_: int, feeds: dict[str, Any]) -> dict[str, Any]:
            key = (part, ar, cl_)
            if key not in sessions:
                sessions[key] = ort.InferenceSession(str(twins[key]), toolchain.session_options({}, cpu_fallback=False))
            s = sessions[key]
            return dict(zip([o.name for o in s.get_outputs()], s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})))

        send.send(tokens.forced_logits(layout, run, prompts, ref, cl))
    except Exception as e:  # noqa: BLE001 - ORT's message to the parent as one line
        send.send(str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__)
