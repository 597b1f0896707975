"""llm_eval: token-level verification of an `llm:` recipe for one target.

Per context length and prompt: the float static graphs decode greedily on the CPU; the QDQ graphs (CPU EP) and
the compiled graphs (HTP simulator) are teacher-forced on those tokens (ctxbuild/llm/tokens.py). The simulator
cannot load multi-graph (weight-shared) binaries (QNN-NOTES), so it runs each graph's single-graph twin, compiled
from the same QDQ model with the same options; the bundles are inputs so any change re-verifies. The simulator
runs in a child process: a crash there is an error here, not a dead build.

With `adapter` (llm.adapters): the same decode with that adapter bound everywhere: the float graphs and the QDQ
graphs are fed the values of its `.onnx_adapter` files, the twins load those files (LoraAdapter +
RunOptions.add_active_adapter, as an application does); graphs without slots run as they are. The result also says
how much the adapter changes the float model's greedy tokens (`tokens_changed_by_adapter`): an adapter that
changes nothing proves nothing. And, as verify_adapter does, which tensors of each graph leave their quantization
range with the adapter (`clipping`: the float graphs' activations on the calls of the decode, against the QDQ
graphs' encodings), named when the verification fails.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from ctxbuild.errors import ActionError, cause_line
from ctxbuild.figures import under
from ctxbuild.llm.layout import Layout
from ctxbuild.llm.prompts import load_prompts, prompt_files, tokenizer_of
from ctxbuild.lora.adapters import read_onnx_adapter, slot_defaults_of
from ctxbuild.plan.action import Action

METHOD = "single-graph twins on the HTP simulator (it cannot load the weight-shared multi-graph binaries)"


def discover_inputs(action: Action) -> dict[str, Path]:
    return prompt_files(Path(action.watch[0]), action.params["prompts"])


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text())}


def warnings(action: Action) -> list[str]:
    """An adapter that changes none of the float model's greedy tokens on the prompts: its check proves nothing."""
    result = Path(action.outputs["result"])
    if "adapter" not in action.params or not result.is_file():
        return []
    rows = json.loads(result.read_text()).get("by_cl", {})
    if rows and all(r.get("tokens_changed_by_adapter") == 0 for r in rows.values()):
        return [f"{action.description}: adapter '{action.params['adapter']}' changes none of the float model's "
                "greedy tokens on these prompts: indistinguishable from the base, not verified; give prompts it changes"]
    return []


def run(ctx: Any) -> None:
    from ctxbuild.llm import pipeline, tokens

    a, p = ctx.action, ctx.action.params
    layout = Layout.read(Path(a.inputs["layout"]))
    prompts = load_prompts(discover_inputs(a), p["prompts"], tokenizer_of(a))
    references = layout.models("reference", a.inputs)
    defaults = {k: slot_defaults_of(path) for k, path in references.items()}
    bindings = {(g.part, g.ar, g.cl): Path(a.inputs[f"binding:{g.name}"]) for g in layout.graphs
                if f"binding:{g.name}" in a.inputs}
    bound = {k: {**d, **(read_onnx_adapter(bindings[k]) if k in bindings else {})} for k, d in defaults.items()}
    calls: dict[tuple[int, int, int], list[dict[str, Any]]] = {}  # the first calls of each float graph (clipping)
    result: dict[str, Any] = {"graph": "tokens", "method": METHOD, "precision": p["precision"], "prompts": len(prompts),
                              "tokens_per_prompt": p["generate"], "thresholds": p["thresholds"], "by_cl": {},
                              "outputs": {}}
    if "adapter" in p:
        result.update(adapter=p["adapter"], calibrated=p["calibrated"])
    failures = []
    for cl in sorted({g.cl for g in layout.graphs}):
        # sessions of one CL at a time: an LLM's graphs hold the weights once per graph
        float_cpu = pipeline.cpu_runner(layout.models("reference", a.inputs, cl), bound)

        def float_run(part: int, ar: int, cl_: int, feeds: dict[str, Any]) -> dict[str, Any]:
            kept = calls.setdefault((part, ar, cl_), [])
            if "adapter" in p and len(kept) < CLIP_CALLS:
                kept.append(feeds)
            return float_cpu(part, ar, cl_, feeds)

        ref = tokens.float_runs(layout, float_run, prompts, p["generate"], cl)
        row: dict[str, Any] = {}
        if "adapter" in p:
            base = tokens.float_runs(layout, pipeline.cpu_runner(layout.models("reference", a.inputs, cl), defaults),
                                     prompts, p["generate"], cl)
            row["tokens_changed_by_adapter"] = round(1 - tokens.compare(base, [r.logits for r in ref])["token_agreement"], 4)
        if "qdq:" + layout.graphs[0].name in a.inputs:
            row["qdq_cpu"] = tokens.compare(ref, tokens.forced_logits(
                layout, pipeline.cpu_runner(layout.models("qdq", a.inputs, cl), bound), prompts, ref, cl))
        row["simulator"] = tokens.compare(ref, _simulate(layout, a.inputs, bindings, prompts, ref, cl, p["timeout_s"]))
        result["by_cl"][str(cl)] = row
        sim, t = row["simulator"], p["thresholds"]
        # the report's and the build summary's per-output view: the simulator's logits at this CL
        result["outputs"][f"logits@cl{cl}"] = {"cosine": sim["cosine_mean"], "snr_db": sim["sqnr_db"],
                                                "argmax_agreement": sim["token_agreement"]}
        if not (sim["token_agreement"] >= t["min_token_agreement"] and sim["cosine_mean"] >= t["min_cosine"]):
            failures.append(f"CL {cl}: top-1 agreement {sim['token_agreement']:.2f} (min {t['min_token_agreement']}), "
                            f"logits cosine {under(sim['cosine_mean'], t['min_cosine'])} (min {t['min_cosine']})")
    hint = "try precision w8a16, kv_cache uint16, or more calibration prompts (docs/llm.md)"
    if "adapter" in p and "qdq:" + layout.graphs[0].name in a.inputs:
        result["clipping"] = _clipping(layout, a.inputs, calls, bound, ctx.tmp)
        if result["clipping"]:
            named = ", ".join(f"'{c['tensor']}' of {c['graph']} ({c['fraction']:.1%} of values)"
                              for c in result["clipping"][:4])
            hint = f"the adapter does not fit the base's encodings: {named} clip; add it to llm.adapters.calibrate"
    result["passed"] = not failures
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    if failures:
        with_adapter = f" with adapter '{p['adapter']}'" if "adapter" in p else ""
        raise ActionError(f"{a.recipes[0]}{with_adapter}@{a.target['name']}: " + "; ".join(failures), hint)


CLIP_CALLS = 8  # calls per graph the clipping analysis replays (prompt chunks and token steps)


def _clipping(layout: Layout, inputs: dict[str, str], calls: dict[tuple[int, int, int], list[dict[str, Any]]],
              bound: dict[tuple[int, int, int], dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """verify_adapter's clipped_tensors per graph with slots, over the calls the float decode made with the adapter."""
    from ctxbuild.actions.verify_adapter import clipped_tensors
    from ctxbuild.graph.modelio import load

    out = []
    for g in layout.graphs:
        key = (g.part, g.ar, g.cl)
        if f"binding:{g.name}" not in inputs or not calls.get(key):
            continue
        reference = Path(inputs[f"reference:{g.name}"])
        names = {i.name for i in load(reference, external_data=False).graph.input}
        feeds = [{k: v for k, v in {**f, **bound[key]}.items() if k in names} for f in calls[key]]
        work = tmp / g.name
        work.mkdir()
        out += [{"graph": g.name, **c} for c in clipped_tensors(reference, Path(inputs[f"qdq:{g.name}"]), feeds,
                                                                bound[key], work)]
    return sorted(out, key=lambda c: -c["fraction"])


def in_simulator(child: Callable[..., None], args: tuple[Any, ...], cl: int, timeout: float) -> Any:
    """What `child(*args, send)` sends from a child process of its own (a simulator crash there is an error here,
    not a dead build); a timeout, a crash or the child's one-line error raised as one line naming CL `cl`."""
    from ctxbuild.verify.measure import in_child

    got, exitcode, hung = in_child(child, args, timeout)
    if got is None:
        why = f"did not finish within {timeout:g} s" if hung else f"crashed (exit {exitcode})"
        raise ActionError(f"the HTP simulator {why} at CL {cl}",
                          "raise verify.timeout_s, or verify fewer prompts (llm.prompts.verify)")
    if isinstance(got, str):
        raise ActionError(f"the HTP simulator failed at CL {cl}: {got}")
    return got


def _simulate(layout: Layout, inputs: dict[str, str], bindings: dict[tuple[int, int, int], Path], prompts: list[Any],
              ref: list[Any], cl: int, timeout: float) -> list[Any]:
    return in_simulator(_child, (layout, layout.models("twin", inputs), bindings, prompts, ref, cl), cl, timeout)


def _child(layout: Layout, twins: dict[tuple[int, int, int], Path], bindings: dict[tuple[int, int, int], Path],
           prompts: list[Any], ref: list[Any], cl: int, send: Any) -> None:
    import onnxruntime as ort

    from ctxbuild.llm import tokens
    from ctxbuild.toolchain import installed as toolchain

    try:
        sessions: dict[tuple[int, int, int], Any] = {}
        options: dict[tuple[int, int, int], Any] = {}

        def run(part: int, ar: int, cl_: int, feeds: dict[str, Any]) -> dict[str, Any]:
            key = (part, ar, cl_)
            if key not in sessions:
                sessions[key] = ort.InferenceSession(str(twins[key]), toolchain.session_options({}, cpu_fallback=False))
                if key in bindings:  # the adapter as an application binds it: its .onnx_adapter, per run
                    lora = ort.LoraAdapter()
                    lora.Load(str(bindings[key]))
                    ro = ort.RunOptions()
                    ro.add_active_adapter(lora)
                    options[key] = (ro, lora)  # the adapter object lives as long as the options using it
            s = sessions[key]
            got = s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()}, options.get(key, (None,))[0])
            return dict(zip([o.name for o in s.get_outputs()], got))

        send.send(tokens.forced_logits(layout, run, prompts, ref, cl))
    except Exception as e:  # noqa: BLE001 - ORT's message to the parent as one line
        send.send(cause_line(e, last=True))
