"""Per-layer diagnosis: which nodes lose accuracy, and where: in quantization or on the HTP.

Three runs of the same samples, compared tensor by tensor:
- the float model and the QDQ model on onnxruntime's CPU EP, every intermediate tensor an output
  (onnxruntime.quantization.qdq_loss_debug: `modify_model_output_intermediate_tensors`,
  `collect_activations`, `create_activation_matching`, `create_weight_matching`): quantization loss;
- a debug variant of the QDQ model compiled with the QNN EP and run on the HTP simulator, chosen
  intermediate tensors ("probes") extra graph outputs: the HTP's own loss, against the QDQ model on the CPU.
A probe is a second DequantizeLinear on the tensor's QuantizeLinear output, made a graph output: the QNN
graph emits the tensor the HTP computed, while the nodes the HTP fuses keep their QDQ groups (the tensor a
group reads is untouched). Whether the debug build
still computes the same final outputs as the delivered one is measured and recorded (`debug_build`).
Large graphs are probed in rounds: evenly spaced tensors first, then the stretch between the two probes
where the HTP's loss grew most (a bisection over the topological order).

Loss per node is the relative noise power it adds: noise(x) = 10^(-SNR_x/10), a node adds
noise(its output) - noise(its noisiest input). The diagnosis runs on demand (`ctxbuild verify --layers
RECIPE`), not as an action after every failed verify: it costs extra compiles and simulator runs of a
graph with many outputs, and a failed verify is routine in a precision search. A failed verify computes
the cheap CPU half itself to name the nodes in its hint (`failure_hint`).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.verify import slices as output_slices
from ctxbuild.errors import ActionError

TOP = 8  # nodes shown
MAX_PROBES = 32  # extra outputs per debug build
ROUNDS = 2
_CAP = 120.0
WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# Below this a weight tensor is coarse: uint8 per-tensor weights of the examples measure 41-44 dB, the
# PP-OCRv4 recognizer's worst 14-27 dB (outlier channels stretch one scale over the whole tensor).
WEAK_WEIGHT_DB = 30.0


# ---- CPU: float vs QDQ ------------------------------------------------------------------------------------

def _reader(samples: list[dict[str, np.ndarray]]) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    return Reader()


def _private(model: Path, tmp: Path, name: str) -> str:
    """onnxruntime's quantization tools write scratch files beside their input: give them a private link,
    and copies of its external data files (onnx refuses data files that are links or have several links)."""
    from ctxbuild.graph.modelio import external_data_files, load

    dst = tmp / name
    try:
        os.link(model, dst)
    except OSError:
        shutil.copyfile(model, dst)
    for role, path in external_data_files(load(model, external_data=False), model).items():
        data = tmp / role.removeprefix("external:")
        if not data.exists():
            shutil.copyfile(path, data)
    return str(dst)


def _activations(model: Path, samples: list[dict[str, np.ndarray]], tmp: Path, tag: str) -> dict[str, list[np.ndarray]]:
    from onnxruntime.quantization.qdq_loss_debug import collect_activations, modify_model_output_intermediate_tensors

    src = _private(model, tmp, f"{tag}.onnx")
    augmented = str(tmp / f"{tag}.augmented.onnx")
    modify_model_output_intermediate_tensors(src, augmented)
    return collect_activations(augmented, _reader(samples))


def snr_db(ref: Any, got: Any) -> float:
    from ctxbuild.verify.measure import metrics

    r = np.concatenate([np.ravel(x) for x in ref]) if isinstance(ref, list) else np.ravel(ref)
    g = np.concatenate([np.ravel(x) for x in got]) if isinstance(got, list) else np.ravel(got)
    return float(metrics(r, g)["snr_db"])


@dataclass
class CpuSide:
    float_acts: dict[str, list[np.ndarray]]
    qdq_acts: dict[str, list[np.ndarray]]  # float model's tensor name -> the QDQ model's value after Q/DQ
    quant_snr: dict[str, float]  # float vs QDQ-on-CPU, per tensor (cumulative)
    weight_snr: dict[str, float]  # float weight vs its dequantized value
    producer: dict[str, str] = field(default_factory=dict)  # tensor -> the QDQ model's node computing it
    activation_bits: int = 0  # the widest activation QuantizeLinear of the QDQ model (0: none)


def qdq_tensors(qdq: Any, float_tensors: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Where the QDQ model holds each float tensor's quantized value: float tensor -> QDQ tensor, and the
    QDQ node that computes it (before its QuantizeLinear).

    The quantizer fuses an activation into its producer (Conv+Relu: the Relu is removed and the Conv writes
    the Relu's output name, its QuantizeLinear range clamping at 0), so the QDQ model's tensor of that name
    is the Conv's raw output; only the DequantizeLinear after its QuantizeLinear is the Relu's value. A
    graph output's last DequantizeLinear writes the output's own name."""
    nodes = list(qdq.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    inits = {i.name for i in qdq.graph.initializer}
    where: dict[str, str] = {}
    computed_by: dict[str, str] = {}
    for dq in nodes:
        q = producer.get(dq.input[0]) if dq.op_type == "DequantizeLinear" else None
        if q is None or q.op_type != "QuantizeLinear" or q.input[0] in inits:
            continue
        name = dq.output[0] if dq.output[0] in float_tensors else q.input[0]
        if name in float_tensors and name not in where:
            where[name] = dq.output[0]
            src = producer.get(q.input[0])
            if src is not None:
                computed_by[name] = src.name
    for n in nodes:  # tensors the QDQ model computes without quantizing them
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for o in n.output:
            if o in float_tensors and o not in where and o not in {q.input[0] for q in nodes
                                                                     if q.op_type == "QuantizeLinear"}:
                where[o], computed_by[o] = o, n.name
    return where, computed_by


def activation_bits(qdq: Any) -> int:
    """8 or 16: the widest integer type the QDQ model quantizes activations to (its zero points' type)."""
    from onnx import TensorProto

    inits = {i.name: i for i in qdq.graph.initializer}
    wide = (TensorProto.UINT16, TensorProto.INT16)
    bits = [16 if inits[n.input[2]].data_type in wide else 8 for n in qdq.graph.node
            if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits and n.input[0] not in inits]
    return max(bits, default=0)


def _qdq_activations(qdq: Path, samples: list[dict[str, np.ndarray]], tmp: Path,
                     float_tensors: set[str]) -> tuple[dict[str, list[np.ndarray]], dict[str, str], int]:
    """Run the QDQ model on the CPU with each float tensor's quantized counterpart a graph output."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    src = _private(qdq, tmp, "qdq.onnx")
    m = onnx.load(src, load_external_data=False)
    where, computed_by = qdq_tensors(m, float_tensors)
    outputs = {o.name for o in m.graph.output}
    for t in dict.fromkeys(where.values()):
        if t not in outputs:
            m.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    augmented = tmp / "qdq.augmented.onnx"
    onnx.save(m, str(augmented))
    so = ort.SessionOptions()  # the QDQ arithmetic as written: fused integer kernels (QLinearConv) round otherwise
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(augmented), so, providers=["CPUExecutionProvider"])
    names = list(dict.fromkeys(where.values()))
    acts: dict[str, list[np.ndarray]] = {t: [] for t in where}
    for s in samples:
        got = dict(zip(names, sess.run(names, s)))
        for t, q in where.items():
            acts[t].append(np.ravel(got[q]))
    return acts, computed_by, activation_bits(m)


def cpu_side(reference: Path, qdq: Path, samples: list[dict[str, np.ndarray]], tmp: Path) -> CpuSide:
    f = _activations(reference, samples, tmp, "float")
    post, computed_by, bits = _qdq_activations(qdq, samples, tmp, set(f))
    quant = {name: snr_db(f[name], v) for name, v in post.items()}
    return CpuSide(f, post, quant, weight_snr(reference, qdq), computed_by, bits)


def weight_snr(reference: Path, qdq: Path) -> dict[str, float]:
    """SNR of every weight the QDQ model dequantizes from an initializer, against the float weight.

    Not qdq_loss_debug.create_weight_matching: it subtracts the zero point in the weight's own integer dtype,
    which wraps around for uint8 weights (measured: -11 dB for weights whose real SNR is 40 dB)."""
    from onnx import numpy_helper

    from ctxbuild.graph.modelio import load

    floats = {i.name: i for i in load(reference).graph.initializer}
    model = load(qdq)
    inits = {i.name: i for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in inits:
            continue
        name = n.output[0].removesuffix("_DequantizeLinear_Output")
        if name not in floats:
            continue
        q = numpy_helper.to_array(inits[n.input[0]]).astype(np.float64)
        scale = numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)
        zp = numpy_helper.to_array(inits[n.input[2]]).astype(np.float64) if len(n.input) > 2 else np.zeros_like(scale)
        if scale.size > 1:  # per channel along `axis`
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            shape[axis] = scale.size
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        out[name] = round(snr_db(numpy_helper.to_array(floats[name]), (q - zp) * scale), 2)
    return out


# ---- the graph --------------------------------------------------------------------------------------------

class Graph:
    """The float model's nodes in topological order, and the SNR a tensor carries from upstream."""

    def __init__(self, model: Any) -> None:
        self.nodes = list(model.graph.node)
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.sources = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
        self.outputs = [o.name for o in model.graph.output]

    def upstream(self, tensor: str, snr: dict[str, float], memo: dict[str, float]) -> float:
        """SNR of `tensor` if measured, else the worst measured SNR feeding it (sources are exact)."""
        if tensor in snr:
            return snr[tensor]
        if tensor in memo:
            return memo[tensor]
        memo[tensor] = _CAP  # cycles cannot happen in ONNX, but a guard costs nothing
        node = self.producer.get(tensor)
        if node is None or tensor in self.sources:
            return _CAP
        memo[tensor] = min((self.upstream(i, snr, memo) for i in node.input if i), default=_CAP)
        return memo[tensor]

    def ordered_tensors(self, among: set[str]) -> list[str]:
        return [o for n in self.nodes for o in n.output if o in among]


def _noise(snr: float) -> float:
    return 10 ** (-snr / 10)


def _added_db(out_snr: float, in_snr: float) -> float | None:
    """The node's own relative noise power in dB (-120 = none), or None when it reduced the noise."""
    added = _noise(out_snr) - _noise(in_snr)
    return round(10 * np.log10(added), 2) if added > 1e-12 else None


def fused_group(g: Graph, node: Any, head: str | None) -> list[Any]:
    """The float nodes the quantizer fused into `head` (the QDQ node computing `node`'s output): the chain
    from `head` down to `node` along first inputs (Conv -> Relu), or `node` alone."""
    by_name = {n.name: n for n in g.nodes}
    if head is None or head == node.name or head not in by_name:
        return [node]
    chain = [node]
    while chain[-1].name != head:
        up = g.producer.get(chain[-1].input[0]) if chain[-1].input else None
        if up is None or len(chain) > 8:
            return [node]
        chain.append(up)
    return chain[::-1]


def node_losses(g: Graph, snr: dict[str, float], computed_by: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Per node with a measured output: SNR in (worst input) and out, and the noise it adds. A node the
    quantizer fused with the ones after it (Conv+Relu) is one row, named after the first (`fused`: the rest)."""
    memo: dict[str, float] = {}
    rows = {}
    for n in g.nodes:
        outs = [o for o in n.output if o in snr]
        if not outs:
            continue
        group = fused_group(g, n, (computed_by or {}).get(outs[0]))
        head = group[0]
        out_snr = min(snr[o] for o in outs)
        in_snr = min((g.upstream(i, snr, memo) for i in head.input if i and i not in g.sources), default=_CAP)
        name = head.name or outs[0]
        rows[name] = {"node": name, "op_type": "+".join(x.op_type for x in group), "tensor": outs[0],
                      "fused": [x.name for x in group[1:]],
                      "snr_in_db": round(in_snr, 2), "snr_db": round(out_snr, 2),
                      "added_db": _added_db(out_snr, in_snr)}
    return rows


# ---- HTP: the debug variant on the simulator ---------------------------------------------------------------

def probe_model(qdq: Any, tensors: list[str], shapes: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """The QDQ model with a second DequantizeLinear on each tensor's QuantizeLinear, made a graph output
    (in a model without QuantizeLinear, the tensor itself)."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(qdq)
    quantizer = {n.input[0]: n for n in m.graph.node if n.op_type == "QuantizeLinear"}
    outputs = {o.name for o in m.graph.output}
    probes: dict[str, str] = {}
    produced = {o for n in m.graph.node for o in n.output}
    for t in tensors:
        if t in outputs:
            probes[t] = t
            continue
        q = quantizer.get(t)
        if q is None:
            if not quantizer and t in produced:  # a float model (fp16 on the HTP): the tensor itself
                m.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, shapes.get(t)))
                probes[t] = t
            continue
        name = f"{t}__probe"
        m.graph.node.append(helper.make_node("DequantizeLinear", [q.output[0], *q.input[1:]], [name],
                                             name=name, **{a.name: helper.get_attribute_value(a) for a in q.attribute
                                                           if a.name == "axis"}))
        m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shapes.get(t)))
        probes[t] = name
    return m, probes


def htp_run(qdq_path: Path, tensors: list[str], shapes: dict[str, Any], samples: list[dict[str, np.ndarray]],
            compile_params: dict[str, Any], tmp: Path, timeout: float) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Compile the debug variant for the target and run it on the simulator: tensor -> HTP values."""
    import onnx

    from ctxbuild.qnn.compile import compile_graph
    from ctxbuild.graph.modelio import load
    from ctxbuild.verify.measure import simulate

    model, probes = probe_model(load(qdq_path), tensors, shapes)
    d = Path(tempfile.mkdtemp(prefix="probe-", dir=tmp))
    src, ctx = d / "debug.onnx", d / "debug_ctx.onnx"
    onnx.save(model, src)
    params = {**compile_params, "embed": False, "cpu_fallback": True}
    try:
        compile_graph(src, ctx, params, d)
    except ActionError:
        raise
    except Exception as e:  # noqa: BLE001 - ORT's exceptions are untyped
        raise ActionError(f"the debug build with {len(probes)} probe outputs did not compile: "
                          f"{str(e).strip().splitlines()[-1][:200]}") from None
    got = simulate(ctx, samples, cpu_fallback=True, timeout=timeout)
    wrapper = onnx.load(str(ctx), load_external_data=False)
    facts = {"probes": len(probes), "partitions": sum(n.op_type == "EPContext" for n in wrapper.graph.node),
             "cpu_nodes": sum(n.op_type != "EPContext" for n in wrapper.graph.node)}
    return {t: got[p] for t, p in probes.items() if p in got}, facts


def _pick(order: list[str], limit: int) -> list[str]:
    if len(order) <= limit:
        return list(order)
    idx = np.linspace(0, len(order) - 1, limit).round().astype(int)
    return [order[i] for i in sorted(set(idx))]


# ---- the whole diagnosis ----------------------------------------------------------------------------------

def diagnose(reference: Path, qdq: Path, samples: list[dict[str, np.ndarray]], compile_params: dict[str, Any],
             thresholds: dict[str, float], *, slices: dict[str, Any] | None = None,
             delivered: Path | None = None, max_probes: int = MAX_PROBES,
             rounds: int = ROUNDS, timeout: float = 600, top: int = TOP) -> dict[str, Any]:
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
            acts = _activations(reference, samples, tmp, "float")
            cpu = CpuSide(acts, acts, {t: _CAP for t in acts}, {})
        order = g.ordered_tensors(set(cpu.qdq_acts) & set(cpu.float_acts))
        probed: dict[str, np.ndarray] = {}
        runs: list[dict[str, Any]] = []
        chosen = _pick(order, max_probes)
        for r in range(rounds):
            want = [t for t in dict.fromkeys(chosen + g.outputs) if t not in probed]
            if not want:
                break
            got, facts = htp_run(qdq, want, shapes, samples, compile_params, tmp, timeout)
            probed.update(got)
            runs.append({"round": r + 1, "tensors": sorted(got), **facts})
            # next round: every tensor between the two consecutive probes where the HTP's loss grew most
            seq = [t for t in order if t in probed]
            htp_snr = {t: snr_db(cpu.qdq_acts[t], probed[t]) for t in seq}
            gaps = [(_noise(htp_snr[b]) - _noise(htp_snr[a]), a, b) for a, b in zip(seq, seq[1:])]
            if not gaps:
                break
            _, a, b = max(gaps)
            inside = order[order.index(a) + 1:order.index(b)]
            chosen = _pick([t for t in inside if t not in probed], max_probes)
        debug_outputs = {o: probed[o] for o in g.outputs if o in probed}
        if delivered is not None:  # does the debug build still compute what the delivered one does?
            real = simulate(delivered, samples, cpu_fallback=True, timeout=timeout)
            runs.append({"debug_vs_delivered_snr_db": {o: round(snr_db(real[o], v), 2)
                                                       for o, v in debug_outputs.items() if o in real}})

    htp = {t: snr_db(cpu.qdq_acts[t], v) for t, v in probed.items()}
    total = {t: snr_db(cpu.float_acts[t], v) for t, v in probed.items()}
    q_rows = node_losses(g, cpu.quant_snr, cpu.producer)
    h_rows = node_losses(g, htp, cpu.producer)
    weights_of = _weights_per_node(float_model, cpu.weight_snr)
    nodes = []
    for name, qr in q_rows.items():
        hr = h_rows.get(name)
        nodes.append({"node": name, "op_type": qr["op_type"], "tensor": qr["tensor"], "fused": qr["fused"],
                      "weight_snr_db": weights_of.get(name),
                      "quant_snr_db": qr["snr_db"], "quant_added_db": qr["added_db"],
                      "htp_snr_db": hr["snr_db"] if hr else None, "htp_added_db": hr["added_db"] if hr else None,
                      "total_snr_db": round(total[qr["tensor"]], 2) if qr["tensor"] in total else None})
    sliced = output_slices.find(float_model, slices)
    outputs = {}
    for o in g.outputs:
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
        outputs[o] = row
    where = _where(outputs, thresholds)
    worst_q = _worst(nodes, "quant_added_db", top)
    worst_h = _worst(nodes, "htp_added_db", top)
    return {"samples": len(samples), "thresholds": thresholds, "outputs": outputs, "where": where,
            "worst_quantization": worst_q, "worst_htp": worst_h, "nodes": len(nodes), "probe_runs": runs,
            "hint": _weak_slice_fix(outputs, thresholds)
            or likely_fix(where, worst_q if where == "quantization" else worst_h, weights_of,
                          _weights_per_node(float_model, cpu.weight_snr, role=2), cpu.activation_bits)}


def _cat(x: list[np.ndarray], shape: list[int | None] | None) -> np.ndarray:
    known = shape and all(shape)
    return np.concatenate([np.asarray(v).reshape(shape) if known else np.asarray(v) for v in x])


def _weights_per_node(model: Any, weight_snr: dict[str, float], role: int = 1) -> dict[str, float]:
    """node -> SNR of its quantized weight (role 1) or bias (role 2: int32, scale = input x weight scale)."""
    return {n.name: weight_snr[n.input[role]] for n in model.graph.node
            if n.op_type in WEIGHTED_OPS and len(n.input) > role and n.input[role] in weight_snr}


def _worst(nodes: list[dict[str, Any]], key: str, top: int) -> list[dict[str, Any]]:
    ranked = [n for n in nodes if n.get(key) is not None]
    return sorted(ranked, key=lambda n: -n[key])[:top]


def _where(outputs: dict[str, Any], t: dict[str, float]) -> str:
    """'quantization' when the QDQ model on the CPU already misses a threshold (whole or a slice), else 'htp'."""
    for row in outputs.values():
        q = row["quantization"]
        if not all(_passes(m, t) for m in [q, *(q.get("slices") or [])]):
            return "quantization"
    return "htp"


def _weak_slice_fix(outputs: dict[str, Any], t: dict[str, float]) -> str | None:
    weak = [f"'{o}' ({s['slice']})" for o, row in outputs.items() for side in row.values()
            for s in side.get("slices") or [] if not _passes(s, t)]
    if not weak:
        return None
    return (f"weak slice {', '.join(dict.fromkeys(weak))} of a concatenated output: compile.split_outputs: true "
            "compiles the parts as separate outputs, each with its own quantization scale")


def likely_fix(where: str, worst: list[dict[str, Any]], weights: dict[str, float] | None = None,
               biases: dict[str, float] | None = None, activation_bits: int = 8) -> str:
    """The fix the numbers point at. `weights`, `biases`: node -> SNR of its quantized weight / bias;
    `activation_bits`: what the QDQ model quantizes activations to (16: do not advise 16-bit activations)."""
    names = [n["node"] for n in worst[:3]]
    listed = ", ".join(f"{n['node']} ({n['op_type']})" for n in worst[:3]) or "none measured"
    if where == "htp":
        return (f"the QDQ model meets the thresholds on the CPU; the HTP's own arithmetic loses it, most at "
                f"{listed}: move those nodes off the NPU (compile.cpu_fallback with them kept in float), "
                "or build them at higher precision")
    clipped = sorted((snr, node) for node, snr in (biases or {}).items() if snr < WEAK_WEIGHT_DB)
    if clipped:  # a bias's int32 scale is input scale x weight scale: a too-narrow input range clips it
        shown = ", ".join(f"{node} {snr:.0f} dB" for snr, node in clipped[:3])
        return (f"quantization loses it: the biases of {shown} do not fit their int32 scale (input scale x weight "
                f"scale): the calibration samples cover a narrower range than the inputs verified on; calibrate on "
                f"inputs like the real ones (the noise grows most at {listed})")
    coarse = sorted((snr, node) for node, snr in (weights or {}).items() if snr < WEAK_WEIGHT_DB)
    if coarse:
        shown = ", ".join(f"{node} {snr:.0f} dB" for snr, node in coarse[:3])
        return (f"quantization loses it: {len(coarse)} weight tensor(s) keep less than {WEAK_WEIGHT_DB:.0f} dB "
                f"(worst: {shown}): use per-channel weights or 16-bit weights; the noise grows most at {listed} "
                f"(candidates for 16-bit overrides)")
    if activation_bits >= 16:  # the activations have their range already: the weights are what is left
        return (f"quantization loses it, most at {listed}, with 16-bit activations already: per-channel weights "
                f"(quantization.per_channel) or 16-bit weights for nodes {', '.join(names)}, or move them off the NPU")
    return (f"quantization loses it, most at {listed}: their activations need more range: 16-bit activations, "
            f"or overrides for nodes {', '.join(names)}, or move them off the NPU")


def failure_hint(reference: Path, compiled: Path, samples: list[dict[str, np.ndarray]],
                 float_out: dict[str, np.ndarray], result: dict[str, Any], *, recipe: str, precision: str,
                 split: bool = False) -> str:
    """verify's hint on failure: the cheap CPU half of the diagnosis (no extra compile or simulator run).
    `split`: the graph was compiled with split_outputs, so a weak slice is not cured by it."""
    from ctxbuild.verify.measure import cpu_outputs, metrics

    more = f"`ctxbuild verify --layers {recipe}` lists the worst nodes"
    weak = _weak_slice_fix({n: {"htp": m} for n, m in result["outputs"].items()}, result["thresholds"])
    if weak and not split:  # one scale over slices of very different ranges: the cure is known, no diagnosis needed
        return weak
    if compiled.resolve() == reference.resolve():
        return f"the {precision} model loses accuracy on the HTP itself; {more}"
    try:
        qdq_out = cpu_outputs(compiled, samples)
        t = result["thresholds"]
        quant = {n: metrics(float_out[n], qdq_out[n]) for n in float_out if n in qdq_out}
        if all(_passes(m, t) for m in quant.values()):
            snr = min(m["snr_db"] for m in quant.values())
            return (f"the QDQ model on the CPU passes (SNR {snr:.1f} dB): the loss is on the HTP; {more} "
                    "(candidates to move off the NPU)")
        with tempfile.TemporaryDirectory(prefix="ctxbuild-hint-") as tmp:  # one sample: a hint, not the diagnosis
            cpu = cpu_side(reference, compiled, samples[:1], Path(tmp))
        from ctxbuild.graph.modelio import load

        model = load(reference, external_data=False)
        rows = list(node_losses(Graph(model), cpu.quant_snr, cpu.producer).values())
        return likely_fix("quantization", _worst(rows, "added_db", 3), _weights_per_node(model, cpu.weight_snr),
                          _weights_per_node(model, cpu.weight_snr, role=2), cpu.activation_bits) + f"; {more}"
    except Exception as e:  # noqa: BLE001 - a hint must never hide the verification failure itself
        return f"{more} (no quick diagnosis: {type(e).__name__})"


def _passes(m: dict[str, Any], t: dict[str, float]) -> bool:
    return m["cosine"] >= t["min_cosine"] and m["snr_db"] >= t["min_snr_db"]


def format_text(d: dict[str, Any]) -> str:
    lines = [f"{d['graph']}@{d['target']}: loss is mostly in {d['where']} ({d['samples']} samples)"]
    for o, row in d["outputs"].items():
        parts = [f"{k} SNR {v['snr_db']:.1f} dB cos {v['cosine']:.4f}"
                 + "".join(f" [{x['slice']} {x['snr_db']:.1f} dB]" for x in v.get("slices") or []) for k, v in row.items()]
        lines.append(f"  output {o}: " + "; ".join(parts))
    lines.append("  (SNR: of the node's output; added: the noise the node itself adds, dB relative to its signal)")
    head = f"  {'node':<36} {'op':<14} {'w SNR':>6} {'quant SNR':>9} {'q added':>8} {'HTP SNR':>8} {'h added':>8}"
    for title, rows in (("worst in quantization (float vs QDQ on CPU)", d["worst_quantization"]),
                        ("worst on the HTP (HTP simulator vs QDQ on CPU)", d["worst_htp"])):
        lines += [f" {title}:", head]
        lines += [f"  {r['node'][:36]:<36} {r['op_type'][:14]:<14} {_f(r['weight_snr_db']):>6} {_f(r['quant_snr_db']):>9} "
                  f"{_f(r['quant_added_db']):>8} {_f(r['htp_snr_db']):>8} {_f(r['htp_added_db']):>8}" for r in rows]
    lines.append(f" hint: {d['hint']}")
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def write(path: Path, data: dict[str, Any]) -> None:
    from ctxbuild.atomic import write_bytes

    write_bytes(path, json.dumps(data, indent=2, sort_keys=True).encode())
