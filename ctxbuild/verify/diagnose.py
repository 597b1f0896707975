"""Per-layer diagnosis: which nodes lose accuracy, and where: in quantization or on the HTP.

Three runs of the same samples, compared tensor by tensor:
- the float model and the QDQ model on onnxruntime's CPU EP, every intermediate tensor an output: quantization
  loss (layerloss.py);
- a debug variant of the QDQ model compiled with the QNN EP and run on the HTP simulator, chosen intermediate
  tensors ("probes") extra graph outputs: the HTP's own loss, against the QDQ model on the CPU (probe.py).
Whether the debug build still computes the same final outputs as the delivered one is measured and recorded
(`debug_build`). Large graphs are probed in rounds: evenly spaced tensors first, then the stretch between the
two probes where the HTP's loss grew most (a bisection over the topological order). advice.py turns the
numbers into the likely fix.

The diagnosis runs on demand (`ctxbuild verify --layers RECIPE`), not as an action after every failed verify:
it costs extra compiles and simulator runs of a graph with many outputs, and a failed verify is routine in a
precision search. A failed verify computes the cheap CPU half itself to name the nodes in its hint
(advice.failure_hint).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.verify import slices as output_slices
from ctxbuild.verify.advice import (fp16_cause, fp16_neighbours, likely_fix, meets, weak_slice_fix, weights_per_node,
                                    where_lost, worst_nodes)
from ctxbuild.verify.layerloss import CAP, CpuSide, Graph, activations, cpu_side, node_losses, noise, snr_db
from ctxbuild.verify.probe import htp_run

TOP = 8  # nodes shown
MAX_PROBES = 32  # extra outputs per debug build
ROUNDS = 2


def _pick(order: list[str], limit: int) -> list[str]:
    if len(order) <= limit:
        return list(order)
    idx = np.linspace(0, len(order) - 1, limit).round().astype(int)
    return [order[i] for i in sorted(set(idx))]


# ---- the whole diagnosis ----------------------------------------------------------------------------------

def diagnose(reference: Path, qdq: Path, samples: list[dict[str, np.ndarray]], compile_params: dict[str, Any],
             thresholds: dict[str, float], *, slices: dict[str, Any] | None = None,
             delivered: Path | None = None, max_probes: int = MAX_PROBES,
             rounds: int = ROUNDS, timeout: float = 600, top: int = TOP, htp: bool = True,
             fusions: bool = True) -> dict[str, Any]:
    """`htp`: False runs the CPU half only (float vs QDQ on the CPU), where the loss is already known to be
    quantization's: no debug build, no simulator run. `fusions`: False skips htp_fusions' compile (the mixed
    rung's culprits, which do not read them)."""
    import onnx

    from ctxbuild.graph.modelio import load
    from ctxbuild.verify.measure import metrics, simulate

    float_model = load(reference)
    g = Graph(float_model)
    inferred = onnx.shape_inference.infer_shapes(float_model)
    shapes = {v.name: [d.dim_value or None for d in v.type.tensor_type.shape.dim]
              for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    with tempfile.TemporaryDirectory(prefix="ctxbuild-diagnose-") as tmp_s:
        tmp = Path(tmp_s)
        quantized = qdq.resolve() != reference.resolve()
        if quantized:
            cpu = cpu_side(reference, qdq, samples, tmp)
        else:  # fp16 / an already-quantized model: the compiled model is the reference itself
            acts = activations(reference, samples, tmp, "float")
            cpu = CpuSide(acts, acts, {t: CAP for t in acts}, {})
        order = g.ordered_tensors(set(cpu.qdq_acts) & set(cpu.float_acts))
        # the float outputs: an integer output (a constant length beside a spectrogram) has no activations to
        # compare with
        outs = [o for o in g.outputs if o in cpu.float_acts and o in cpu.qdq_acts]
        probed: dict[str, np.ndarray] = {}
        runs: list[dict[str, Any]] = []
        chosen = _pick(order, max_probes)
        for r in range(rounds if htp else 0):
            want = [t for t in dict.fromkeys(chosen + outs) if t not in probed]
            if not want:
                break
            got, facts = htp_run(qdq, want, shapes, samples, compile_params, tmp, timeout)
            probed.update(got)
            runs.append({"round": r + 1, "tensors": sorted(g.names.user_tensor(t) for t in got), **facts})
            # next round: every tensor between the two consecutive probes where the HTP's loss grew most
            seq = [t for t in order if t in probed]
            htp_snr = {t: snr_db(cpu.qdq_acts[t], probed[t]) for t in seq}
            gaps = [(noise(htp_snr[b]) - noise(htp_snr[a]), a, b) for a, b in zip(seq, seq[1:])]
            if not gaps:
                break
            _, a, b = max(gaps)
            inside = order[order.index(a) + 1:order.index(b)]
            chosen = _pick([t for t in inside if t not in probed], max_probes)
        fused = htp_fusions(qdq, compile_params, tmp) if htp and fusions else []
        debug_outputs = {o: probed[o] for o in outs if o in probed}
        real: dict[str, np.ndarray] = {}
        if delivered is not None:  # does the debug build still compute what the delivered one does?
            real = simulate(delivered, samples, cpu_fallback=True, timeout=timeout)
            runs.append({"debug_vs_delivered_snr_db": {o: round(snr_db(real[o], v), 2)
                                                       for o, v in debug_outputs.items() if o in real}})

    htp = {t: snr_db(cpu.qdq_acts[t], v) for t, v in probed.items()}
    total = {t: snr_db(cpu.float_acts[t], v) for t, v in probed.items()}
    q_rows = node_losses(g, cpu.quant_snr, cpu.producer)
    h_rows = node_losses(g, htp, cpu.producer)
    weights_of = weights_per_node(float_model, cpu.weight_snr)
    fused_with = {n: f for f in fused for n in f["nodes"]}
    nodes = []
    for name, qr in q_rows.items():
        hr = h_rows.get(name)
        fusion = fused_with.get(name)
        # the tensor by the user's name too (prepare's new name for one it carries: the user's)
        nodes.append({"node": name, "op_type": qr["op_type"], "tensor": g.names.user_tensor(qr["tensor"]),
                      "fused": qr["fused"],
                      "weight_snr_db": weights_of.get(name),
                      "quant_snr_db": qr["snr_db"], "quant_added_db": qr["added_db"],
                      "htp_snr_db": hr["snr_db"] if hr else None, "htp_added_db": hr["added_db"] if hr else None,
                      "total_snr_db": round(total[qr["tensor"]], 2) if qr["tensor"] in total else None,
                      **({"htp_fused": {"qnn_op": fusion["qnn_op"], "with": [n for n in fusion["nodes"] if n != name]}}
                         if fusion else {})})
    sliced = output_slices.find(float_model, slices)
    outputs = {}
    for o in outs:
        # qdq_loss_debug flattens what it collects: back to the output's shape, samples stacked
        flo, qdq_cpu = (_cat(x, shapes.get(o)) for x in (cpu.float_acts[o], cpu.qdq_acts[o]))
        pairs = {"quantization": (flo, qdq_cpu)}
        if o in probed:
            pairs["htp"] = (qdq_cpu, probed[o])
            pairs["total"] = (flo, probed[o])
        row: dict[str, Any] = {}
        for k, (ref, got) in pairs.items():
            row[k] = metrics(ref, got)
            per_slice = output_slices.measure(ref, got, sliced[o], metrics) if o in sliced else None
            if per_slice:
                row[k]["slices"] = per_slice
        if o in real and o in probed:  # the delivered build against the float model, as verify measures it
            row["delivered"] = metrics(flo, np.ravel(real[o]))
        outputs[o] = row
    where = where_lost(outputs, thresholds)
    worst_q = worst_nodes(nodes, "quant_added_db", top)
    worst_h = worst_nodes(nodes, "htp_added_db", top)
    # fp16 (the model compiled as given): what its float values show fp16 cannot hold
    cause = None if quantized else fp16_cause(float_model, cpu.float_acts, [n["node"] for n in worst_h])
    passed = meets(outputs, thresholds)
    # the debug build meets them and the delivered one does not: its figures describe another computation
    unlike = _unlike(outputs, thresholds, len(probed)) if passed else None
    return {"samples": len(samples), "thresholds": thresholds, "outputs": outputs, "where": where,
            "meets": passed and not unlike,
            "worst_quantization": worst_q, "worst_htp": worst_h, "nodes": len(nodes), "probe_runs": runs,
            "htp_fusions": fused,
            # every node's own noise power on the HTP, summed: what the mixed rung's blame leaves (culprits.py)
            "htp_noise_added": sum(noise(-n["htp_added_db"]) for n in nodes if n["htp_added_db"] is not None),
            "hint": unlike or (f"nothing to fix on these {len(samples)} samples: it meets min cosine "
                               f"{thresholds['min_cosine']} / min SNR {thresholds['min_snr_db']} dB (where verification "
                               "failed on others, diagnose more: --samples N)")
            # fp16: no scale to split; split already: the parts have their scales, the fix is elsewhere
            if passed else (cpu.activation_bits and not compile_params.get("split_outputs")
                            and weak_slice_fix(outputs, thresholds))
            or likely_fix(where, worst_q if where == "quantization" else worst_h, weights_of,
                          weights_per_node(float_model, cpu.weight_snr, role=2), cpu.activation_bits, cause,
                          fp16_neighbours(float_model, worst_q if where == "quantization" else worst_h,
                                          "quant_added_db" if where == "quantization" else "htp_added_db"))}



def _unlike(outputs: dict[str, Any], thresholds: dict[str, float], probes: int) -> str | None:
    """None, or when the debug build meets the thresholds and the delivered one does not: that the per-node figures
    describe another computation (an fp16 Mul(x, HardSigmoid(x)) with hardswish_order off: delivered 3.4 dB, the
    debug build, the HardSigmoid's output probed, 69.6 dB)."""
    failing = {o: row["delivered"] for o, row in outputs.items()
               if "delivered" in row and not meets({o: {"quantization": row["delivered"]}}, thresholds)}
    if not failing:
        return None
    said = ", ".join(f"'{o}' SNR {m['snr_db']:.1f} dB delivered, {outputs[o]['total']['snr_db']:.1f} dB in the debug "
                     f"build" for o, m in failing.items())
    return (f"the delivered build fails ({said}) where the debug build with {probes} probed tensors as outputs meets "
            "the thresholds: the HTP computes the delivered graph differently (a fusion across a probed tensor, which "
            "the EP's op trace does not show: docs/verification.md, \"Fused nodes\"), so these per-node figures do not "
            "describe its loss")


def htp_fusions(model: Path, compile_params: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    """The QNN ops the delivered graph's compile made of several of the user's nodes, from the EP's op trace
    (qnn/optrace.py): `model` compiled again as the compile action did (one compile: deterministic, and the trace is
    not written when a compiled model is loaded). The debug builds' probes can break a fusion, so theirs would not
    do. [] on a toolchain without the trace."""
    from ctxbuild.errors import ActionError
    from ctxbuild.graph.modelio import load
    from ctxbuild.graph.nodenames import named
    from ctxbuild.qnn import optrace
    from ctxbuild.qnn.compile import QnnCompileFailed, compile_graph, trace_dir

    d = Path(tempfile.mkdtemp(prefix="traced-", dir=tmp))
    try:
        compile_graph(model, d / "traced_ctx.onnx",
                      {"cpu_fallback": True, **compile_params, "embed": False}, d)  # the mixed rung's: no fallback key
    except (ActionError, QnnCompileFailed) as e:  # it compiled for the delivery: a diagnosis goes on without it
        print(f"the compile for the op trace failed ({e}): fusions not shown")
        return []
    found = optrace.fused(trace_dir(d))
    if not found:
        return []
    proto = load(model, external_data=False)
    op = {n.name: n.op_type for n in proto.graph.node}
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # one group may make several QNN ops (a Reshape, an FC)
    for f in found:
        nodes = tuple(dict.fromkeys(u for n in f.nodes for u, _ in named(proto, [(n, op.get(n, ""))])))
        groups.setdefault((f.group, nodes), []).append(f.qnn_op)
    return [{"qnn_op": " + ".join(ops), "fusion": group, "nodes": list(nodes)} for (group, nodes), ops in groups.items()]


def _cat(x: list[np.ndarray], shape: list[int | None] | None) -> np.ndarray:
    known = shape and all(shape)
    return np.concatenate([np.asarray(v).reshape(shape) if known else np.asarray(v) for v in x])


def format_text(d: dict[str, Any]) -> str:
    lines = [f"{d['graph']}@{d['target']}: " + ("meets the thresholds; what is lost is " if d.get("meets") else
                                               "loss is ") + f"mostly in {d['where']} ({d['samples']} samples)"]
    for o, row in d["outputs"].items():
        parts = [f"{k} SNR {v['snr_db']:.1f} dB cos {v['cosine']:.4f}"
                 + "".join(f" [{x['slice']} {x['snr_db']:.1f} dB]" for x in v.get("slices") or []) for k, v in row.items()]
        lines.append(f"  output {o}: " + "; ".join(parts))
    lines.append("  (SNR: of the node's output; added: the noise the node itself adds, dB relative to its signal)")
    # full names, the column as wide as the longest: the user's model has these names (exporters' share long
    # scopes, so a cut name at either end can read the same on several rows, or match nothing in the model)
    w = max([36] + [len(r["node"]) for r in d["worst_quantization"] + d["worst_htp"]])
    head = f"  {'node':<{w}} {'op':<14} {'w SNR':>6} {'quant SNR':>9} {'q added':>8} {'HTP SNR':>8} {'h added':>8}"
    for title, rows in (("worst in quantization (float vs QDQ on CPU)", d["worst_quantization"]),
                        ("worst on the HTP (HTP simulator vs QDQ on CPU)", d["worst_htp"])):
        lines += [f" {title}:", head]
        lines += [f"  {r['node']:<{w}} {r['op_type'][:14]:<14} {_f(r['weight_snr_db']):>6} {_f(r['quant_snr_db']):>9} "
                  f"{_f(r['quant_added_db']):>8} {_f(r['htp_snr_db']):>8} {_f(r['htp_added_db']):>8}" for r in rows]
    shown_nodes = {r["node"] for r in d["worst_quantization"] + d["worst_htp"]}
    lines += [f" fused on the HTP into one {f['qnn_op']} ({f['fusion']}): {', '.join(f['nodes'])}"
              for f in d.get("htp_fusions", []) if shown_nodes & set(f["nodes"])]
    lines.append(f" hint: {d['hint']}")
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def write(path: Path, data: dict[str, Any]) -> None:
    from ctxbuild.atomic import write_bytes

    write_bytes(path, json.dumps(data, indent=2, sort_keys=True).encode())
