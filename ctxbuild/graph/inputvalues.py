"""The recipe's `input_values:`: inputs the app always sets to one value (a sample rate, a mode flag) made
constants of the model, and the `If` nodes they decide replaced by the branch that value takes.

Exports often branch on such an input (silero-vad: `If(sr == 16000)` around the whole network); QNN runs fixed
graphs without control flow, so the model could not build at all. With the input a constant, an If whose
condition is computed from constants and from shapes the fixed input shapes decide is inlined: its chosen
branch's nodes take its place (names as the model has them), until no such If is left. What the model computes
for that value does not change: verification runs the user's model with the input set to it (verify/memo.py)."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and onnx are imported where used: planning imports this module for its names only
    import numpy as np

KEY = "ctxbuild.input_values"  # prepared-model metadata: {input: {"value": ..., "dtype": ...}} the samples may hold
# An input this small (an integer or boolean scalar, a few flags; a float of one element) can be a setting the app
# fixes; a larger one is data.
SETTING_MAX_ELEMENTS = 16
_SHAPE_OPS = frozenset({"Shape", "Size"})
_NOT_EVALUATED = frozenset({"If", "Loop", "Scan", "RandomNormal", "RandomNormalLike", "RandomUniform",
                            "RandomUniformLike", "Multinomial", "Bernoulli"})


def as_array(value: Any, elem_type: int, dims: list[int | None]) -> np.ndarray:
    """The recipe's value as the input's dtype and shape (a scalar fills a shape of one element); ValueError
    saying what does not fit."""
    import numpy as np
    from onnx.helper import tensor_dtype_to_np_dtype

    dtype = np.dtype(tensor_dtype_to_np_dtype(elem_type))
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{json.dumps(value)} is not a number, a boolean or a list of them")
    if dtype.kind in "biu" and arr.dtype.kind == "f" and not np.array_equal(arr, np.round(arr)):
        raise ValueError(f"the input is {dtype.name}, {json.dumps(value)} is not a whole number")
    if dtype.kind == "b" and arr.dtype.kind != "b":
        raise ValueError(f"the input is bool, give true or false (not {json.dumps(value)})")
    if arr.ndim == 0 and dims and all(d in (1, None) for d in dims):
        arr = arr.reshape([1] * len(dims))
    if arr.ndim != len(dims) or any(isinstance(d, int) and d > 0 and d != s for d, s in zip(dims, arr.shape)):
        want = "[" + ", ".join("?" if not isinstance(d, int) or d <= 0 else str(d) for d in dims) + "]"
        raise ValueError(f"the input's shape is {want}, the value's is {list(arr.shape)}")
    cast = arr.astype(dtype)
    if dtype.kind in "iu" and not np.array_equal(cast, arr):
        raise ValueError(f"{json.dumps(value)} does not fit in {dtype.name}")
    return cast


def declared(model: Any) -> dict[str, tuple[int, list[int | None]]]:
    """The model's graph inputs (initializers excluded): name -> (onnx elem_type, dims, None where open)."""
    inits = {t.name for t in model.graph.initializer}
    return {i.name: (i.type.tensor_type.elem_type, [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                                                    else None for d in i.type.tensor_type.shape.dim])
            for i in model.graph.input if i.name not in inits}


def as_arrays(model: Any, values: dict[str, Any]) -> dict[str, np.ndarray]:
    """The recipe's values (JSON) as arrays of `model`'s inputs' dtypes and shapes (as_array); ValueError naming
    the input whose value does not fit, or that the model does not have."""
    types = declared(model)
    found = {}
    for name, value in values.items():
        if name not in types:
            raise ValueError(f"'{name}' is not an input of the model")
        try:
            found[name] = as_array(value, *types[name])
        except ValueError as e:
            raise ValueError(f"'{name}': {e}") from None
    return found


def settings_of(model: Any) -> dict[str, tuple[int, list[int | None]]]:
    """The model's inputs that may be settings rather than data (declared()): fixed shapes of few integer or
    boolean elements, or of one element."""
    import math

    from onnx.helper import tensor_dtype_to_np_dtype

    return {name: (t, dims) for name, (t, dims) in declared(model).items() if None not in dims and (
        math.prod(dims) == 1 or math.prod(dims) <= SETTING_MAX_ELEMENTS and tensor_dtype_to_np_dtype(t).kind in "biu")}


def apply(model: Any, values: dict[str, Any]) -> list[str]:
    """fix() then inline_decided(): the Ifs inlined."""
    fix(model, values)
    return inline_decided(model)


def fix(model: Any, values: dict[str, Any]) -> None:
    """Make the inputs `values` names (the recipe's values, JSON) constants of `model`, in place; ValueError for an
    input the model does not have or a value that does not fit it. Metadata KEY records the values."""
    import onnx
    from onnx import numpy_helper

    g = model.graph
    recorded = {}
    for name, arr in as_arrays(model, values).items():
        g.input.remove(next(i for i in g.input if i.name == name))
        g.initializer.append(numpy_helper.from_array(arr, name))
        recorded[name] = {"value": arr.tolist(), "dtype": arr.dtype.name}
    props = {p.key: p.value for p in model.metadata_props}
    onnx.helper.set_model_props(model, {**props, KEY: json.dumps(recorded, sort_keys=True)})


def inline_decided(model: Any) -> list[str]:
    """Inline, in place, each If of the main graph whose condition constants and static shapes decide (the inputs
    fix() made constants, an exporter's test of a dimension the recipe fixes), until none is left; the Ifs
    inlined, as the model names them."""
    g = model.graph
    inlined = []
    while (found := _decided_if(model)) is not None:
        index, take = found
        inlined.append(g.node[index].name or g.node[index].output[0])
        _inline(g, index, take)
    return inlined


def recorded(model: Any) -> dict[str, np.ndarray]:
    """The input values a prepared model was made with (metadata KEY), as arrays: what samples may hold for inputs
    the model no longer has."""
    import numpy as np

    props = {p.key: p.value for p in model.metadata_props}
    return {k: np.asarray(v["value"], np.dtype(v["dtype"])) for k, v in json.loads(props.get(KEY, "{}")).items()}


def deciding_inputs(model: Any, node: Any) -> list[str]:
    """The inputs that alone decide an If's branch and do nothing else, as settings do: its condition computed
    from them, constants and fixed shapes only, each input small (settings_of) and read by nothing but what
    computes that condition; [] when data decides it."""
    nodes = {o: n for n in model.graph.node for o in n.output}
    settings, inits = settings_of(model), {t.name for t in model.graph.initializer}
    found: list[str] = []
    todo, seen, computing = [node.input[0]], set(), {id(node)}
    while todo:
        t = todo.pop()
        if t in seen or not t or t in inits:
            continue
        seen.add(t)
        if t in settings:
            found.append(t)
        elif (n := nodes.get(t)) is None or n.op_type in _NOT_EVALUATED:
            return []  # an input that is data, or a value control flow computes
        elif n.op_type not in _SHAPE_OPS:
            computing.add(id(n))
            todo.extend(n.input)
    # a setting feeds the condition only: an input other nodes read as data is data (a sum of features); and a
    # model whose every input decides the branch has nothing left to run on
    if any(set(n.input) & (seen - inits) and id(n) not in computing for n in model.graph.node
           if n is not node) or set(found) == set(declared(model)):
        return []
    return sorted(found)


def _decided_if(model: Any) -> tuple[int, str] | None:
    """The first If of the main graph whose condition is a constant now: (its index, "then_branch"/"else_branch")."""
    ifs = [i for i, n in enumerate(model.graph.node) if n.op_type == "If"]
    if not ifs:
        return None
    shapes = _static_shapes(model)
    for i in ifs:
        cond = _static_value(model, model.graph.node[i].input[0], shapes)
        if cond is not None:
            return i, "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    return None


def _static_shapes(model: Any) -> dict[str, list[int]]:
    """Tensor -> shape, where onnx's shape inference (with data propagation) fixes every dim."""
    import onnx

    try:
        typed = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except onnx.shape_inference.InferenceError:
        return {}
    found = {}
    for v in (*typed.graph.input, *typed.graph.value_info, *typed.graph.output):
        t = v.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            found[v.name] = [d.dim_value for d in t.shape.dim]
    for t in model.graph.initializer:
        found[t.name] = list(t.dims)
    return found


def _static_value(model: Any, tensor: str, shapes: dict[str, list[int]]) -> np.ndarray | None:
    """`tensor`'s value when constants and static shapes alone compute it (onnx's reference evaluator runs the
    nodes that do), else None."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    nodes = {o: n for n in g.node for o in n.output}
    need: list[Any] = []  # the nodes computing `tensor`, shape ops made constants
    used: set[str] = set()
    todo, seen = [tensor], set()
    while todo:
        t = todo.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if t in inits:
            if inits[t].data_location == onnx.TensorProto.EXTERNAL:
                return None
            used.add(t)
            continue
        n = nodes.get(t)
        if n is None or n.op_type in _NOT_EVALUATED or n.domain not in ("", "ai.onnx"):
            return None  # a graph input, control flow, a random draw, or an op onnx cannot evaluate
        if n.op_type in _SHAPE_OPS:
            shape = shapes.get(n.input[0])
            if shape is None:
                return None
            value = np.array(shape, np.int64) if n.op_type == "Shape" else np.array(int(np.prod(shape)), np.int64)
            if n.op_type == "Shape":
                attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
                value = value[attrs.get("start", 0):attrs.get("end", len(shape))]
            need.append(helper.make_node("Constant", [], [t], value=numpy_helper.from_array(value)))
            continue
        need.append(n)
        todo.extend(n.input)
    order = {id(n): i for i, n in enumerate(g.node)}
    need.sort(key=lambda n: order.get(id(n), -1))  # the made Constants first, then graph order
    sub = helper.make_graph(need, "cond", [], [helper.make_empty_tensor_value_info(tensor)],
                            [inits[t] for t in sorted(used)])
    try:
        (value,) = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})
    except Exception:  # noqa: BLE001 - an op the reference evaluator lacks: the If stays, prepare says so
        return None
    return np.asarray(value)


def _inline(g: Any, index: int, branch: str) -> None:
    """Replace the If at `index` of graph `g` by the nodes of its `branch`, their outputs wired to the If's."""
    from onnx import helper

    node = g.node[index]
    body = next(a.g for a in node.attribute if a.name == branch)
    taken = _names(g, skip=index)
    rename = {}
    for n in body.node:  # SSA across scopes: a name the outer graph already has gets a fresh one
        for o in n.output:
            if o in taken:
                rename[o] = _fresh(o, taken)
    for t in body.initializer:
        if t.name in taken:
            rename[t.name] = _fresh(t.name, taken)
    produced = {o for n in body.node for o in n.output}
    wired = []
    for inner, outer in zip(body.output, node.output):
        if inner.name in produced and inner.name not in rename and inner.name not in {o.name for o in g.output}:
            rename[inner.name] = outer  # the node computing it writes the If's output directly
        else:  # an outer tensor or a constant passed through
            wired.append(helper.make_node("Identity", [rename.get(inner.name, inner.name)], [outer],
                                          name=f"{node.name or outer}/{inner.name}"))
    new = []
    for n in body.node:
        c = type(n)()
        c.CopyFrom(n)
        _rename(c, rename)
        new.append(c)
    for t in body.initializer:
        c = type(t)()
        c.CopyFrom(t)
        c.name = rename.get(t.name, t.name)
        g.initializer.append(c)
    g.value_info.extend(v for v in body.value_info if v.name not in rename)
    del g.node[index]
    for k, n in enumerate(new + wired):
        g.node.insert(index + k, n)


def _rename(node: Any, rename: dict[str, str]) -> None:
    """Rename tensors a node (and the subgraphs it holds) reads or writes."""
    for k, t in enumerate(node.input):
        node.input[k] = rename.get(t, t)
    for k, t in enumerate(node.output):
        node.output[k] = rename.get(t, t)
    for a in node.attribute:
        for sub in [a.g] if a.HasField("g") else list(a.graphs):
            for n in sub.node:
                _rename(n, rename)


def _names(g: Any, skip: int = -1) -> set[str]:
    """Every tensor name graph `g` and its subgraphs use, but for those of node `skip` (the If inlined)."""
    found = {i.name for i in g.input} | {t.name for t in g.initializer} | {o.name for o in g.output}
    for n in (n for k, n in enumerate(g.node) if k != skip):
        found.update(n.input)
        found.update(n.output)
        for a in n.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                found |= _names(sub)
    return found


def _fresh(name: str, taken: set[str]) -> str:
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    taken.add(f"{name}_{k}")
    return f"{name}_{k}"
