"""llm_part_eval: one part of an `llm:` recipe verified for one target, on the calls the float decode recorded.

The float static graphs' decode of the verification prompts (llm_split) recorded this part's inputs and float
outputs (ctxbuild/llm/records.py: per CL the first PREFILL_WINDOWS prefill windows, per prompt and CL the first
DECODE_STEPS token steps). Here the part's graphs are compiled alone (the HTP simulator cannot load the weight-shared multi-graph bundle,
QNN-NOTES): the same QDQ models with the bundle's options, inside this action's temporary directory, not kept.
Every recorded call runs on the QDQ graph (CPU EP) and on those twins (simulator, in a child process: a crash there
is an error here). By default (llm.simulator: auto) a part over SUBSET_ABOVE bytes of QDQ weights compiles and runs on the simulator only the graphs
that cover each of its sequence lengths and each of its context lengths once (at the 1B shape AR 128 at CL 1024 and AR
1 at CL 2048, one call each: a call of a 4-layer part took the simulator 50-55 s at AR 1 and 183-216 s at AR 128; the
other graphs differ from these in shapes only, same weights and encodings), and the CPU, covering every graph and
call, is gated as well (hidden states and logits agreed with the simulator's to ~1e-4 at w8a16; at w4a16 the int4
layers' KV did not, see below). fp16 has no QDQ graph: every call runs on the simulator. Each output is compared with the float
graph's (cosine, SNR), the last part's logits also by top-1 agreement with the float model's tokens. Parts are independent: their checks run side by side, and no other
part's graphs are loaded. The bundle is an input, so a changed deliverable re-verifies.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.actions.llm_eval import in_simulator
from ctxbuild.errors import ActionError, cause_line
from ctxbuild.figures import under
from ctxbuild.llm import records
from ctxbuild.llm.layout import Layout
from ctxbuild.llm.static import GraphSpec
from ctxbuild.plan.action import Action

# Above this many bytes of a part's QDQ weights the simulator runs one recorded call on each covering graph: a call
# of a 4-layer part of the 1B shape (~120 MB at w4a16) took it 50-216 s; the small models' calls take it about a second.
SUBSET_ABOVE = 64 << 20

METHOD = ("the part's QDQ graphs on the CPU on the calls the float decode recorded (per CL the first "
          f"{records.PREFILL_WINDOWS} prefill windows, per prompt and CL the first {records.DECODE_STEPS} token steps), "
          "and its single-graph twins (compiled here, not kept) on the HTP simulator on {simulated}")
SIMULATED = {"all": "all of them",
             "covering": "one call on each graph of those covering each sequence and context length once (the largest "
                         "AR's last window, AR 1's first step)",
             "auto": f"all of them, or for parts over {SUBSET_ABOVE >> 20} MiB of QDQ weights one call on each graph of "
                     "those covering each sequence and context length once (the largest AR's last window, AR 1's "
                     "first step)"}
BACKENDS = {"simulator": "simulator", "qdq_cpu": "QDQ graph on the CPU"}

Outputs = dict[int, dict[str, np.ndarray]]  # recorded call (its index) -> the compared rows of each output


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text())}


def run(ctx: Any) -> None:
    from ctxbuild.lora.adapters import slot_defaults_of

    a, p = ctx.action, ctx.action.params
    layout = Layout.read(Path(a.inputs["layout"]))
    mine = {(g.ar, g.cl): g for g in layout.graphs if g.name in p["graphs"]}
    calls = records.read(Path(a.inputs["records"]))
    # LoRA slots are required inputs of the QDQ graphs and their twins: fed their defaults, as the wrappers hold them
    slots = {k: slot_defaults_of(Path(a.inputs[f"reference:{g.name}"])) if f"reference:{g.name}" in a.inputs else {}
             for k, g in mine.items()}
    weights = max((Path(v).stat().st_size for k, v in a.inputs.items() if k.startswith("model:") and k.endswith(".data")),
                  default=0)
    simulated = on_simulator(calls, p["precision"], weights, p["simulator"])
    start = time.monotonic()
    # the twins the quality check keeps (the largest CL's, plan/llm.py) are used as they are; the others compiled here
    twins = {k: Path(a.inputs[f"twin:{g.name}"]) if f"twin:{g.name}" in a.inputs else _compile(ctx, g)
             for k, g in mine.items() if k in {(c.ar, c.cl) for c in simulated.values()}}
    ctx.facts["twin_compile_seconds"] = round(time.monotonic() - start, 3)
    ctx.facts["twin_bin_bytes"] = sum(t.with_name(t.name.replace("_ctx.onnx", "_ctx_qnn.bin")).stat().st_size
                                      for t in twins.values())
    start = time.monotonic()
    sim, seconds = _simulate(twins, simulated, slots, p["timeout_s"])
    ctx.facts["simulator_seconds"] = round(time.monotonic() - start, 3)
    ctx.facts["simulator_seconds_by_graph"] = {mine[k].name: round(v, 3) for k, v in seconds.items()}
    got = {"simulator": sim}
    if p["precision"] != "fp16":  # fp16 compiles the float graphs: the CPU would compare them with themselves
        got["qdq_cpu"] = _cpu({k: Path(a.inputs[f"model:{g.name}"]) for k, g in mine.items()}, calls, slots)
    export = _export_names(Path(a.inputs[f"model:{next(iter(mine.values())).name}"]))
    result = _result(p, mine, calls, got, export)
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    if not result["passed"]:
        failures = result["failures"]
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        raise ActionError(f"{a.recipes[0]}@{a.target['name']}: {result['graph']}: " + "; ".join(failures[:3]) + more,
                          "try precision w8a16, kv_cache uint16, or more calibration prompts (docs/llm.md)",
                          details=result)


def _export_names(model: Path) -> dict[str, str]:
    """The export's names of the part's tensors the static pass renamed (the residual stream at a cut,
    `hidden_states.K`: llm/static.py); a part's graphs share them."""
    from ctxbuild.graph.modelio import load
    from ctxbuild.graph.nodenames import Names

    return Names(load(model, external_data=False)).tensor_from


def _compile(ctx: Any, g: GraphSpec) -> Path:
    """The graph's single-graph twin in the action's temporary directory (gone with it)."""
    from ctxbuild.qnn.compile import QnnCompileFailed, compile_error, compile_graph
    from ctxbuild.qnn.staging import link_model

    a = ctx.action
    d = ctx.tmp / "twins" / g.name
    d.mkdir(parents=True)
    dst = d / f"{g.name}_ctx.onnx"
    params = {"provider_options": a.params["provider_options"], "embed": False, "cpu_fallback": False}
    try:
        compile_graph(link_model(Path(a.inputs[f"model:{g.name}"]), d, "model.onnx"), dst, params, ctx.tmp)
    except QnnCompileFailed as failed:
        raise compile_error(ctx.log_path, failed.error, False, params["provider_options"],
                            model=Path(a.inputs[f"model:{g.name}"])) from None
    return dst


def _cpu(models: dict[tuple[int, int], Path], calls: list[records.Call], slots: dict[tuple[int, int], Any]) -> Outputs:
    from ctxbuild.llm import pipeline

    out: Outputs = {}
    for cl in sorted({c.cl for c in calls}):  # one CL's sessions at a time
        run = pipeline.cpu_runner({(0, ar, cl_): m for (ar, cl_), m in models.items() if cl_ == cl},
                                  {(0, ar, cl_): s for (ar, cl_), s in slots.items()})
        out.update({i: _compared(run(0, c.ar, c.cl, c.feeds()), c) for i, c in enumerate(calls) if c.cl == cl})
    return out


def _compared(got: dict[str, np.ndarray], c: records.Call) -> dict[str, np.ndarray]:
    return {k: records.compared(k, got[k], c.valid) for k in c.outputs}


def on_simulator(calls: list[records.Call], precision: str, weight_bytes: int, policy: str = "auto"
                 ) -> dict[int, records.Call]:
    """The recorded calls the simulator runs, by index (`policy`: llm.simulator): every call at fp16 (no QDQ graph
    stands in), with "all", and with "auto" for a part under SUBSET_ABOVE; else one call on each of the graphs
    covering_graphs picks: the largest AR's last recorded window (it reads the earlier window's cache through the
    mask's padding), AR 1's first step (it reads a whole prompt's cache)."""
    if precision == "fp16" or policy == "all" or policy == "auto" and weight_bytes < SUBSET_ABOVE:
        return dict(enumerate(calls))
    chosen: dict[tuple[int, int], int] = {}
    covering = covering_graphs({c.ar for c in calls}, {c.cl for c in calls})
    for i, c in enumerate(calls):
        if (c.ar, c.cl) in covering and (c.ar > 1 or (c.ar, c.cl) not in chosen):
            chosen[(c.ar, c.cl)] = i
    return {i: calls[i] for i in sorted(chosen.values())}


def covering_graphs(ars: set[int], cls: set[int]) -> set[tuple[int, int]]:
    """The fewest (AR, CL) graphs in which every sequence length and every context length occurs: ARs from the largest
    paired with CLs from the smallest (the costly prefill graph takes the cheapest context), the shorter list's last
    one repeated."""
    a, c = sorted(ars, reverse=True), sorted(cls)
    return {(a[min(i, len(a) - 1)], c[min(i, len(c) - 1)]) for i in range(max(len(a), len(c)))}


def _simulate(twins: dict[tuple[int, int], Path], calls: dict[int, records.Call], slots: dict[tuple[int, int], Any],
              timeout: float) -> tuple[Outputs, dict[tuple[int, int], float]]:
    """The calls on the twins, one CL at a time in a child of its own (verify.timeout_s each); with the seconds per
    graph: its session's creation and its calls."""
    out: Outputs = {}
    seconds: dict[tuple[int, int], float] = {}
    for cl in sorted({c.cl for c in calls.values()}):
        mine = {i: c for i, c in calls.items() if c.cl == cl}
        got = in_simulator(_child, ({k: t for k, t in twins.items() if k[1] == cl}, mine, slots), cl, timeout)
        out.update(got[0])
        seconds.update(got[1])
    return out, seconds


def _child(twins: dict[tuple[int, int], Path], calls: dict[int, records.Call], slots: dict[tuple[int, int], Any],
           send: Any) -> None:
    import onnxruntime as ort

    from ctxbuild.toolchain import installed as toolchain

    try:
        sessions, seconds = {}, {}
        for k, t in twins.items():
            start = time.monotonic()
            sessions[k] = ort.InferenceSession(str(t), toolchain.session_options({}, cpu_fallback=False))
            seconds[k] = time.monotonic() - start
        out: Outputs = {}
        for i, c in calls.items():
            start = time.monotonic()
            s = sessions[(c.ar, c.cl)]
            feeds = {**slots[(c.ar, c.cl)], **c.feeds()}
            got = s.run(None, {x.name: feeds[x.name] for x in s.get_inputs()})
            out[i] = _compared(dict(zip([o.name for o in s.get_outputs()], got)), c)
            seconds[(c.ar, c.cl)] += time.monotonic() - start
        send.send((out, seconds))
    except Exception as e:  # noqa: BLE001 - ORT's message to the parent as one line
        send.send(cause_line(e, last=True))


def _result(p: dict[str, Any], mine: dict[tuple[int, int], GraphSpec], calls: list[records.Call],
            got: dict[str, Outputs], export: dict[str, str] | None = None) -> dict[str, Any]:
    """Per CL, backend, graph and output the metrics against the float outputs on the calls that backend ran; the
    report's per-output view (the simulator's: each graph's main output and its worst KV output); what fails the
    thresholds, named with the backend (an output the static pass renamed with the export's name too: `export`)."""
    from ctxbuild.verify.measure import metrics

    t = p["thresholds"]
    simulated = SIMULATED["all" if p["precision"] == "fp16" else p["simulator"]]
    result: dict[str, Any] = {"graph": f"part {p['part'] + 1} of {p['parts']}", "method": METHOD.format(simulated=simulated),
                              "precision": p["precision"], "thresholds": t, "prompts": p["prompts"],
                              "prefill_windows": records.PREFILL_WINDOWS, "decode_steps": records.DECODE_STEPS,
                              "by_cl": {}, "outputs": {}, "failures": []}
    top1: dict[tuple[str, int], list[tuple[float, int]]] = {}  # (backend, CL) -> (calls agreeing, calls) per graph
    # the simulator always; the CPU where it stands in for calls the simulator skipped
    gated = {b: b == "simulator" or len(got["simulator"]) < len(calls) for b in got}
    for (ar, cl), g in sorted(mine.items(), key=lambda kv: (kv[0][1], -kv[0][0])):
        row = result["by_cl"].setdefault(str(cl), {})
        for backend, outs in got.items():
            idx = [i for i, c in enumerate(calls) if (c.ar, c.cl) == (ar, cl) and i in outs]
            per = {}
            for name in calls[idx[0]].outputs if idx else []:
                ref = [calls[i].outputs[name] for i in idx]
                mine_ = [outs[i][name] for i in idx]
                if name == "logits":  # [calls, vocab]: argmax_agreement is top-1 against the float tokens
                    m = metrics(np.stack(ref), np.stack(mine_))
                else:
                    m = metrics(np.concatenate([r.ravel() for r in ref]), np.concatenate([x.ravel() for x in mine_]))
                per[name] = {k: m[k] for k in ("cosine", "snr_db", "argmax_agreement") if m[k] is not None}
            row.setdefault(backend, {})[g.name] = {"calls": len(idx), "outputs": per}
            for name, m in per.items():
                if not gated[backend]:
                    continue
                if m.get("argmax_agreement") is not None:  # pooled per CL below: a graph may have several calls
                    top1.setdefault((backend, cl), []).append((m["argmax_agreement"] * len(idx), len(idx)))
                floor = gate_of(name, t)
                if not m["cosine"] >= floor:  # NaN fails too
                    result["failures"].append(
                        f"graph {g.name}, output {name}{_theirs(name, export)}: {BACKENDS[backend]} cosine "
                        f"{under(m['cosine'], floor)} (min {floor}), SNR {m['snr_db']:.1f} dB over {_calls(len(idx))}")
        # what the report and the summary's row show: per gated backend that ran the graph, its main outputs and its
        # worst KV output, each with the floor that gates it (the row's worst figure is always a gated one)
        for backend in (b for b in got if gated[b] and row[b][g.name]["calls"]):
            shown, suffix = row[backend][g.name]["outputs"], "" if backend == "simulator" else " (QDQ graph on the CPU)"
            main = [n for n in shown if not n.startswith("present.")]
            kv = sorted((n for n in shown if n.startswith("present.")), key=lambda n: shown[n]["cosine"])[:1]
            for name in main + kv:
                result["outputs"][f"{name}@{g.name}{suffix}"] = {**shown[name], "min_cosine": gate_of(name, t)}
    for (backend, cl), counts in sorted(top1.items()):
        agreed, calls_ = sum(a for a, _ in counts), sum(n for _, n in counts)
        if agreed / calls_ < t["min_token_agreement"]:
            result["failures"].append(f"CL {cl}, output logits: {BACKENDS[backend]} top-1 agreement "
                                      f"{agreed / calls_:.2f} (min {t['min_token_agreement']}) over {_calls(int(calls_))}")
    result["passed"] = not result["failures"]
    return result


def gate_of(name: str, t: dict[str, Any]) -> float:
    """The cosine floor of an output: `min_kv_cosine` for a KV output (`present.*`), `min_cosine` for the rest."""
    return t.get("min_kv_cosine", t["min_cosine"]) if name.startswith("present.") else t["min_cosine"]


def _theirs(name: str, export: dict[str, str] | None) -> str:
    return f" (the export's '{export[name]}')" if export and name in export else ""


def _calls(n: int) -> str:
    return f"{n} call" + ("s" if n != 1 else "")
