"""The recipe's `outputs:`: a model cut down to the part that computes given tensors (onnx.utils.Extractor), and
where to cut a model QNN cannot run whole: the static part before its data-dependent nodes (NonZero, control
flow), whose size or path depends on the input values, which QNN's fixed graphs cannot follow; for an If whose
branch a setting input decides, the `input_values:` line instead (graph/inputvalues.py).

The cut keeps the model's own inputs, names and nodes: prepare builds it as the model, and verification runs the
user's model cut the same way as the reference (verify/memo.py)."""
from __future__ import annotations

import json
from typing import Any

from ctxbuild.errors import RecipeError

# Ops whose refusal no quantization changes: control flow, data-dependent shapes, random draws (QNN has none of
# them). Their nodes, and everything after them, are what a split leaves to the app.
DATA_DEPENDENT_OPS = frozenset({"If", "Loop", "Scan", "NonZero", "Unique", "RandomNormal", "RandomNormalLike",
                                "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"})
# Their outputs depend on the input's shape only, which a build fixes: constants, not data the cut must carry.
_SHAPE_ONLY = frozenset({"Shape", "Size"})
_NAMES_SHOWN = 3


def tensors(model: Any) -> dict[str, list[str]]:
    """What a recipe's `outputs:` may name and what it may not: {"computed": node outputs of the main graph in
    graph order, "inputs": graph inputs, "constants": initializers}."""
    inits = [t.name for t in model.graph.initializer]
    known = set(inits)
    return {"computed": [o for n in model.graph.node for o in n.output if o],
            "inputs": [i.name for i in model.graph.input if i.name not in known], "constants": inits}


def extract(model: Any, outputs: list[str]) -> Any:
    """The part of `model` (loaded without its external data: tensors keep their locations) that computes
    `outputs` from the model's inputs (all of them, named as the model names them, so its samples still fit).
    Outputs none of which an input reaches are the recipe's mistake: the part would be constants alone."""
    import onnx
    from onnx.utils import Extractor

    if not set(outputs) & _from_inputs(model):  # prepare would fold the whole part into constants
        named = ", ".join(f"'{o}'" for o in outputs)
        raise RecipeError(f"outputs: {named} {'does' if len(outputs) == 1 else 'do'} not depend on the model's inputs "
                          "(computed from constants alone): nothing is left to compile",
                          "name tensors the model computes from its inputs (the app has these as constants)")
    try:  # Extractor takes the outputs' types from value_info
        typed = onnx.shape_inference.infer_shapes(model)
    except onnx.shape_inference.InferenceError:  # ops onnx cannot infer: untyped outputs, onnxruntime types them
        typed = onnx.ModelProto()
        typed.CopyFrom(model)
    known = {v.name for v in (*typed.graph.value_info, *typed.graph.output)}
    typed.graph.value_info.extend(onnx.helper.make_empty_tensor_value_info(o) for o in outputs if o not in known)
    inits = {t.name for t in model.graph.initializer}
    cut = Extractor(typed).extract_model([i.name for i in model.graph.input if i.name not in inits], list(outputs))
    cut.metadata_props.extend(model.metadata_props)
    cut.producer_name, cut.producer_version = model.producer_name, model.producer_version
    return cut


def split_line(model: Any, ops: frozenset[str] | set[str] = DATA_DEPENDENT_OPS, at: set[int] | None = None,
               seen: dict[str, Any] | None = None) -> str | None:
    """One line naming the model's nodes of `ops` (or the nodes `at`, indices into graph.node) as the model names
    them and the recipe line that builds the static part before them; None when there are no such nodes. An If
    whose branch small inputs alone decide gets the `input_values:` line instead, with the values `seen` in the
    recipe's samples."""
    nodes = list(model.graph.node)
    starts = sorted(at) if at is not None else [i for i, n in enumerate(nodes) if n.op_type in ops]
    if not starts:
        return None
    if line := _values_line(model, [nodes[i] for i in starts if nodes[i].op_type == "If"], seen or {}):
        return line
    names = [_label(nodes[i]) for i in starts[:_NAMES_SHOWN]]
    more = f" and {len(starts) - _NAMES_SHOWN} more" if len(starts) > _NAMES_SHOWN else ""
    where = ", ".join(names) + more
    cut = static_outputs(model, set(starts))
    if not cut:
        return (f"nothing before {where} computes from the model's inputs: there is no static part for `outputs:` "
                "to build alone; run the model on the CPU EP in the app")
    return f"build the static part alone with `{outputs_line(cut)}` in the recipe (the rest, from {where} on, runs in the app)"


def _values_line(model: Any, ifs: list[Any], seen: dict[str, Any]) -> str | None:
    """The `input_values:` line for the Ifs whose branch small inputs alone decide (a sample rate, a mode flag),
    with the values the samples agree on; None when data decides every If."""
    from ctxbuild.graph.inputvalues import deciding_inputs

    decided = [(n, names) for n in ifs if (names := deciding_inputs(model, n))]
    if not decided:
        return None
    inputs = sorted({i for _, names in decided for i in names})
    where = ", ".join(_label(n) for n, _ in decided[:_NAMES_SHOWN])
    if all(i in seen for i in inputs):
        told = ", ".join(f"{i} = {json.dumps(seen[i])}" for i in inputs)
        fix = f"if the app always passes {told}, fix it with `{values_line({i: seen[i] for i in inputs})}` in the recipe"
    else:
        fix = (f"if the app always passes one value for {', '.join(inputs)}, fix it with "
               f"`input_values: {{{', '.join(f'{i}: VALUE' for i in inputs)}}}` in the recipe, VALUE that value")
    return f"{where} takes its branch from input {', '.join(inputs)}: {fix}; prepare keeps that branch"


def static_outputs(model: Any, starts: set[int]) -> list[str]:
    """The tensors the part before nodes `starts` (indices into graph.node) computes from the model's inputs that
    those nodes and everything after them read, and the model's outputs that part computes, in graph order.
    Constants and what depends on the input's shape alone are left out: the rest can hold them itself."""
    nodes = list(model.graph.node)
    reads = [_reads(n) for n in nodes]
    after, later = set(starts), {o for i in starts for o in nodes[i].output if o}
    for i, n in enumerate(nodes):  # graph order is topological: one pass finds everything after `starts`
        if i in after or reads[i] & later:
            after.add(i)
            later.update(o for o in n.output if o)
    data = _from_inputs(model)
    wanted = {t for i in after for t in reads[i]} | {o.name for o in model.graph.output}
    return [o for i, n in enumerate(nodes) if i not in after for o in n.output if o and o in wanted and o in data]


def size_sources(model: Any, shapes: list[dict[str, tuple[int, ...]]]) -> set[int]:
    """The nodes (indices into graph.node) where sizes start to follow the data: an output's shape differs between
    runs (`shapes`: tensor -> shape per run) while the shapes of what the node reads do not."""
    varying = {t for t in shapes[0] if len({s.get(t) for s in shapes}) > 1}
    return {i for i, n in enumerate(model.graph.node) if varying & set(n.output) and not varying & _reads(n)}


def every_tensor(model: Any) -> Any:
    """A copy of `model` whose outputs are every tensor its main graph's nodes compute (onnxruntime types them)."""
    import onnx

    seen = onnx.ModelProto()
    seen.CopyFrom(model)
    del seen.graph.output[:]
    seen.graph.output.extend(onnx.ValueInfoProto(name=o) for n in model.graph.node for o in n.output if o)
    return seen


def outputs_line(names: list[str]) -> str:
    """`outputs: [a, b]` as it can be pasted into a YAML recipe: a name YAML would read otherwise is quoted."""
    plain = f"outputs: [{', '.join(names)}]"
    return plain if _reads_back(plain, {"outputs": names}) else f"outputs: [{', '.join(json.dumps(n) for n in names)}]"


def values_line(values: dict[str, Any]) -> str:
    """`input_values: {sr: 16000}` as it can be pasted into a YAML recipe (names quoted where YAML needs it)."""
    plain = f"input_values: {{{', '.join(f'{k}: {json.dumps(v)}' for k, v in values.items())}}}"
    wanted = {"input_values": values}
    return plain if _reads_back(plain, wanted) else \
        f"input_values: {{{', '.join(f'{json.dumps(k)}: {json.dumps(v)}' for k, v in values.items())}}}"


def _reads_back(line: str, wanted: dict[str, Any]) -> bool:
    import yaml

    try:
        return yaml.safe_load(line) == wanted
    except yaml.YAMLError:
        return False


def _from_inputs(model: Any) -> set[str]:
    """The model's inputs and the tensors its nodes compute from them: not constants, not what depends on the
    input's shape alone (a build fixes it)."""
    inits = {t.name for t in model.graph.initializer}
    data = {i.name for i in model.graph.input if i.name not in inits}
    for n in model.graph.node:  # graph order is topological
        if n.op_type not in _SHAPE_ONLY and _reads(n) & data:
            data.update(o for o in n.output if o)
    return data


def _reads(node: Any) -> set[str]:
    """The tensors a node reads: its inputs, and the outer names its subgraphs (If/Loop/Scan bodies) use."""
    found = {t for t in node.input if t}
    for attr in node.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            inner = {t.name for t in g.initializer} | {i.name for i in g.input}
            for n in g.node:
                found |= _reads(n) - inner
                inner |= set(n.output)
    return found


def _label(node: Any) -> str:
    """A node as the model names it: `NonZero 'nz'`, or by its first output when it has no name."""
    if node.name:
        return f"{node.op_type} '{node.name}'"
    return f"{node.op_type} (output '{node.output[0]}')" if node.output else node.op_type
