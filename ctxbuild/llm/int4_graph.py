"""The int4 weights of a part's QDQ graphs rewritten (llm.quantization, ctxbuild/llm/int4.py): the activations each
MatMul weight sees in the float graphs, a sensitivity ranking, and the DequantizeLinear of each int4 weight given the
chosen values and scales (per channel, or block-wise with `block_size` at opset 21).

onnxruntime's quantizer writes a weight W of MatMul `m` as an int4 initializer and a DequantizeLinear feeding
m's second input; its node keeps m's name. The rewrite finds the weight by that MatMul, so it does not depend on the
names the quantizer gives its initializers, and replaces the initializer, the scale and the zero point (int4
zeros) and the node's axis / block_size: standard ONNX, nothing the quantizer would not write itself."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.graph.external_data import tensor_array
from ctxbuild.graph.modelio import load, save_with_data
from ctxbuild.llm.int4 import Int4, blockable, int4
from ctxbuild.llm.records import Call

MAX_TOKENS = 512  # activation rows per matrix the scale search and the ranking use (calls' real tokens, in order)


@dataclass
class Weights4:
    """What llm.quantization chose for one part: weight initializer -> its int4 form (the part's AR x CL graphs
    share their weights, so one choice serves every graph)."""
    chosen: dict[str, Int4] = field(default_factory=dict)
    tokens: int = 0  # activation rows used

    def ranking(self) -> list[str]:
        """The weights, most sensitive first: the largest relative output error at their width."""
        return sorted(self.chosen, key=lambda n: -self.chosen[n].error)

    def summary(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "matrices": len(self.chosen),
                "blockwise": sum(q.block_size is not None for q in self.chosen.values()),
                "ranking": [{"weight": n, "bits": self.chosen[n].bits, "error": round(self.chosen[n].error, 6),
                             "clipped": round(self.chosen[n].clipped, 3), "block_size": self.chosen[n].block_size}
                            for n in self.ranking()]}


def matmul_weights(model: Any) -> dict[str, str]:
    """MatMul node name -> its 2-D initializer weight (input 1); not a LoRA slot's (a graph input whose default is an
    initializer: an activation to the quantizer)."""
    slots = {i.name for i in model.graph.input}
    inits = {t.name: t for t in model.graph.initializer if t.name not in slots}
    return {n.name: n.input[1] for n in model.graph.node
            if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2}


@dataclass
class Seen:
    """The float weights of a part and the activation rows their MatMuls read (gathered once: every choice and
    every `precision: auto` candidate reuses them)."""
    arrays: dict[str, np.ndarray]
    rows: dict[str, np.ndarray]
    tokens: int


def gather(graphs: list[tuple[Path, list[Call]]], weights: set[str]) -> Seen:
    """`weights` and the activations their MatMuls see in the float static graphs on their calls (the part's
    calibration calls; rows from the graphs in order up to MAX_TOKENS)."""
    rows: dict[str, list[np.ndarray]] = {}
    arrays: dict[str, np.ndarray] = {}
    taken = 0
    for path, calls in graphs:
        m = load(path, external_data=False)
        names = {v: k for k, v in matmul_weights(m).items() if v in weights}
        inits = {t.name: t for t in m.graph.initializer}
        for w in names:
            if w not in arrays:
                arrays[w] = tensor_array(inits[w], path).astype(np.float32)
        got, n = activations(path, m, calls, names, MAX_TOKENS - taken)
        for w, x in got.items():
            rows.setdefault(w, []).append(x)
        taken += n
        if taken >= MAX_TOKENS:
            break
    return Seen(arrays, {w: np.concatenate(r) for w, r in rows.items()}, taken)


def choose(seen: Seen, bits: dict[str, int], block_size: int | None, search: bool) -> Weights4:
    """Each weight of `bits` at its width (4 or 8; block-wise only at 4): scales searched or min/max on the
    activations, the relative output error measured."""
    out = Weights4(tokens=seen.tokens)
    for w in sorted(bits):
        a = seen.arrays[w]
        bs = block_size if block_size and bits[w] == 4 and blockable(a.shape[0], block_size) else None
        out.chosen[w] = int4(a, bs, seen.rows.get(w), search, bits[w])
    return out


def activations(model_path: Path, model: Any, calls: list[Call], weights: dict[str, str], limit: int
                ) -> tuple[dict[str, np.ndarray], int]:
    """The first input of the MatMul reading each of `weights` (weight -> node) over the calls' real tokens (at
    most `limit` rows), from the float graph run on the CPU with those tensors as extra outputs; and the rows."""
    import onnx
    import onnxruntime as ort

    by_node = {n.name: n.input[0] for n in model.graph.node if n.input}
    wanted = {w: by_node[node] for w, node in weights.items()}
    tensors = sorted(set(wanted.values()))
    if not tensors or limit <= 0:
        return {}, 0
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in tensors
                          if t not in {o.name for o in m.graph.output})
    tmp = model_path.with_name(f".int4-acts-{os.getpid()}-{model_path.name}")  # beside it: its data file resolves
    onnx.save(m, str(tmp))
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(tmp), so, providers=["CPUExecutionProvider"])
    finally:
        tmp.unlink()
    rows: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    taken = 0
    inputs = [i.name for i in sess.get_inputs()]
    for call in calls:
        if taken >= limit:
            break
        feeds = call.feeds()
        got = sess.run(tensors, {k: feeds[k] for k in inputs})
        keep = min(call.valid, limit - taken)
        for t, v in zip(tensors, got):
            rows[t].append(v.reshape(-1, v.shape[-1])[:keep])  # a padded window's rows past `valid` are not text
        taken += keep
    return {w: np.concatenate(rows[t]) for w, t in wanted.items()}, taken


def rewrite(qdq_path: Path, float_path: Path, chosen: Weights4, dst: Path | None = None) -> int:
    """The QDQ graph at `qdq_path` (its data file beside it, as the quantizer wrote it; quantized from the float
    graph `float_path`) with each chosen weight's DequantizeLinear rewritten (its type too: an int8 weight may become
    int4 and back), saved in place or as `dst`; returns how many."""
    from onnx import helper, numpy_helper

    weight_of = matmul_weights(load(float_path, external_data=False))
    m = load(qdq_path)
    inits = {t.name: t for t in m.graph.initializer}
    producer = {o: n for n in m.graph.node for o in n.output}
    done = 0
    for node in m.graph.node:
        q = chosen.chosen.get(weight_of.get(node.name, ""))
        if node.op_type != "MatMul" or q is None:
            continue
        dq = producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            raise ValueError(f"{qdq_path.name}: {node.name}'s weight has no DequantizeLinear of an initializer")
        values, scale, zp = dq.input[0], dq.input[1], dq.input[2] if len(dq.input) > 2 else f"{dq.input[0]}_zp"
        _replace(m, inits, integers(q.values, q.bits, values))
        _replace(m, inits, numpy_helper.from_array(q.scales, scale))
        _replace(m, inits, integers(np.zeros(q.scales.shape, np.int8), q.bits, zp))
        del dq.input[2:]
        dq.input.append(zp)
        del dq.attribute[:]
        if q.block_size is None:
            dq.attribute.append(helper.make_attribute("axis", 1))
        else:
            dq.domain = ""  # block_size is ONNX's own DequantizeLinear's (opset 21, the QDQ graphs'), not the contrib op's
            dq.attribute.extend([helper.make_attribute("axis", 0), helper.make_attribute("block_size", q.block_size)])
        done += 1
    save_with_data(m, dst or qdq_path)
    return done


def integers(values: np.ndarray, bits: int, name: str) -> Any:
    """An int4 or int8 initializer in raw bytes (int4 packed two to a byte). Not onnx.helper.make_tensor's
    int32_data: onnx's external-data save moves raw data only, and as varints a 1B model's tied head took 1.9 GB
    inline in each graph file (ml_dtypes: onnx's own dependency, its int4 type)."""
    import ml_dtypes
    from onnx import numpy_helper

    return numpy_helper.from_array(values.astype(ml_dtypes.int4 if bits == 4 else np.int8), name)


def _replace(m: Any, inits: dict[str, Any], t: Any) -> None:
    if t.name in inits:
        inits[t.name].CopyFrom(t)
    else:
        m.graph.initializer.append(t)
        inits[t.name] = t


def ranked_8bit(w4: Weights4, share: float) -> list[str]:
    """The sensitivity ranking's pick for int8: the int4 weights with the largest output error, most sensitive
    first, while their elements stay within `share` of all int4 weights' elements."""
    total = sum(q.values.size for q in w4.chosen.values() if q.bits == 4)
    picked, size = [], 0
    for w in (w for w in w4.ranking() if w4.chosen[w].bits == 4):
        n = w4.chosen[w].values.size
        if size + n > share * total:
            break
        picked.append(w)
        size += n
    return picked
