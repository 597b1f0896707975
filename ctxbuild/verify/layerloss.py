"""Where a quantized graph loses accuracy, tensor by tensor and node by node: the float and the QDQ model on
onnxruntime's CPU EP, every intermediate tensor an output (onnxruntime.quantization.qdq_loss_debug:
`modify_model_output_intermediate_tensors`, `collect_activations`), their SNR per tensor, the SNR of each
dequantized weight, and the noise each node adds. diagnose.py compares the HTP's tensors the same way.

Loss per node is the relative noise power it adds: noise(x) = 10^(-SNR_x/10), a node adds
noise(its output) - noise(its noisiest input).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.graph.nodenames import Names

CAP = 120.0  # the SNR of an exact tensor (a source, or nothing measured upstream)


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


def activations(model: Path, samples: list[dict[str, np.ndarray]], tmp: Path, tag: str) -> dict[str, list[np.ndarray]]:
    from onnxruntime.quantization.qdq_loss_debug import collect_activations, modify_model_output_intermediate_tensors

    src = _typed(_private(model, tmp, f"{tag}.onnx"))
    augmented = str(tmp / f"{tag}.augmented.onnx")
    modify_model_output_intermediate_tensors(src, augmented)
    return collect_activations(augmented, _reader(samples))


# onnxruntime's own float ops, which onnx's shape inference has no schema for: their first output has their first
# input's type. SimplifiedLayerNormalization is what prepare's rmsnorm rule writes; the others come from exporters.
SAME_TYPE_OPS = frozenset({"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
                           "SkipLayerNormalization", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "FusedMatMul"})


def _typed(src: str) -> str:
    """`src`, or a copy beside it typing what onnx's shape inference leaves untyped: the output of one of
    SAME_TYPE_OPS gets its first input's type, then what follows it is inferred again. qdq_loss_debug saves only
    typed tensors: otherwise a fused RMSNorm, and everything after it, would go unmeasured."""
    import onnx
    from onnx import helper

    model = onnx.load(src, load_external_data=False)
    inits = {i.name: i.data_type for i in model.graph.initializer}
    added = False
    while True:
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - typing is a help here: untyped tensors just go unmeasured, as before
            break
        known = {**inits, **{v.name: v.type.tensor_type.elem_type for v in [
            *inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output] if v.type.tensor_type.elem_type}}
        missing = [(n.output[0], known[n.input[0]]) for n in model.graph.node if n.op_type in SAME_TYPE_OPS
                   and n.output and n.output[0] not in known and n.input and n.input[0] in known]
        if not missing:
            break
        model.graph.value_info.extend(helper.make_tensor_value_info(o, t, None) for o, t in missing)
        added = True
    if not added:
        return src
    dst = str(Path(src).with_suffix(".typed.onnx"))
    onnx.save(model, dst)
    return dst


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
    f = activations(reference, samples, tmp, "float")
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
        if name not in floats or not np.prod(inits[n.input[0]].dims):  # an empty constant has no SNR
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


class Graph:
    """The float model's nodes in topological order, and the SNR a tensor carries from upstream."""

    def __init__(self, model: Any) -> None:
        self.names = Names(model)  # rows speak the user's node names (prepare's rewrites mapped back)
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
        memo[tensor] = CAP  # cycles cannot happen in ONNX, but a guard costs nothing
        node = self.producer.get(tensor)
        if node is None or tensor in self.sources:
            return CAP
        memo[tensor] = min((self.upstream(i, snr, memo) for i in node.input if i), default=CAP)
        return memo[tensor]

    def ordered_tensors(self, among: set[str]) -> list[str]:
        return [o for n in self.nodes for o in n.output if o in among]


def noise(snr: float) -> float:
    return 10 ** (-snr / 10)


def _added_db(out_snr: float, in_snr: float) -> float | None:
    """The node's own relative noise power in dB (-120 = none), or None when it reduced the noise."""
    added = noise(out_snr) - noise(in_snr)
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
    quantizer fused with the ones after it (Conv+Relu) is one row, named after the first (`fused`: the rest).
    Node names are the user's model's (g.names): nodes prepare made of one user node are one row, the worst;
    `tensor` is the measured one as `snr` names it (the prepared model's: diagnose.py gives the user's name)."""
    memo: dict[str, float] = {}
    rows = {}
    for n in g.nodes:
        outs = [o for o in n.output if o in snr]
        if not outs:
            continue
        group = fused_group(g, n, (computed_by or {}).get(outs[0]))
        head = group[0]
        out_snr = min(snr[o] for o in outs)
        in_snr = min((g.upstream(i, snr, memo) for i in head.input if i and i not in g.sources), default=CAP)
        name = g.names.label(head)  # an unnamed node by its first output: what quantization.nodes takes
        row = {"node": name, "op_type": "+".join(x.op_type for x in group), "tensor": outs[0],
               "fused": list(dict.fromkeys(u for x in group[1:] if (u := g.names.label(x)) != name)),
               "snr_in_db": round(in_snr, 2), "snr_db": round(out_snr, 2), "added_db": _added_db(out_snr, in_snr)}
        if name not in rows or (row["added_db"] or -CAP) > (rows[name]["added_db"] or -CAP):
            rows[name] = row
    return rows
