"""Property tests of the legalization rules: seeded random small graphs around each rule's pattern, many breaking
a condition its rewrite is exact under, are never rewritten into something that computes other values on
onnxruntime's CPU EP (compared with the original; where onnxruntime refuses the original, it refuses the result
too). Each test also checks that its graphs exercise both sides: some rewritten, some left as written.

What no graph shows (attention scores 100 apart under mask_fill, a row with every key masked) is the sample
check's (tests/e2e/test_legalize.py::test_rewrite_that_changes_the_outputs_is_withdrawn); the graphs here keep to
values the static conditions are about."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ctxbuild.graph.legalize import Legalized, legalize
from tests._qnn_models import IR_VERSION

CASES = 40  # graphs per rule: each is two small CPU sessions (~10 ms)
F = TensorProto.FLOAT


def _model(nodes: list, inputs: dict[str, tuple[list[int], int]], outputs: list[str], inits: dict[str, np.ndarray],
           opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, t, s) for k, (s, t) in inputs.items()],
                              [helper.make_tensor_value_info(k, F, None) for k in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def _outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | str:
    so = ort.SessionOptions()
    so.log_severity_level = 4  # refusals are expected here; the message is compared, not logged
    so.add_session_config_entry("session.disable_quant_qdq", "1")  # QDQ as written, as prepare's check runs it
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime's untyped errors: refusing is the property compared
        return str(e).splitlines()[0]


def _same_after(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rule: str, bound: float = 1e-4) -> Legalized:
    """Legalize a copy of `model` with `rule`; its outputs are the original's (relative max abs <= bound, NaN where
    NaN, the same shapes), or onnxruntime refuses both."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    done = legalize(copy, [rule])
    before, after = _outputs(model, feeds), _outputs(copy, feeds)
    assert isinstance(before, str) == isinstance(after, str), (done, before, after, onnx.printer.to_text(model.graph))
    if not isinstance(before, str):
        for a, b in zip(before, after):
            assert a.shape == b.shape, (done, a.shape, b.shape)
            assert np.array_equal(np.isnan(a), np.isnan(b)), (done, a, b)
            a, b = np.nan_to_num(a, nan=0.0), np.nan_to_num(b, nan=0.0)
            scale = max(float(np.abs(a).max(initial=0)), float(np.abs(b).max(initial=0)))
            assert float(np.abs(a - b).max(initial=0)) <= bound * scale, (done, onnx.printer.to_text(model.graph))
    return done


def _tally(results: list[Legalized], rule: str) -> None:
    """Both sides exercised: some graphs rewritten, some left as written (by a condition, with its reason)."""
    rewritten = sum(rule in r.rewrites for r in results)
    kept = sum(rule in r.kept for r in results)
    assert rewritten and kept, (rewritten, kept)
    for r in results:
        assert all(why.startswith("'") or why.startswith("and ") for why in r.kept.get(rule, [])), r.kept


def _rng(rule: str, case: int) -> np.random.Generator:
    return np.random.default_rng([sum(map(ord, rule)), case])


def test_mask_fill_property() -> None:
    """Where(mask, c, fill) added to the scores (c = 0, another constant, or a runtime tensor), or the fill in
    place of the scores (Where(mask, scores, fill)), fills -inf, float32 min, -1e9, -1e4, scores shifted anywhere
    in [-400, 50] but within 60 of each other in a row, every row keeping one key at least."""
    results = []
    for case in range(CASES):
        r = _rng("mask_fill", case)
        fill = float(r.choice([-np.inf, np.finfo(np.float32).min, -1e9, -1e4]))
        shape = [1, 2, 4, 8]
        mask = r.random(shape) < 0.6
        mask[..., 0] = True
        form = r.choice(["zero", "constant", "runtime", "select"])
        inits: dict[str, Any] = {"fill": np.array(fill, np.float32), "shift": np.array(r.uniform(-400, 50), np.float32)}
        nodes = [helper.make_node("Add", ["x", "shift"], ["s"])]
        inputs = {"x": (shape, F), "mask": (shape, TensorProto.BOOL)}
        feeds = {"x": r.uniform(-30, 30, shape).astype(np.float32), "mask": mask}
        if form == "select":
            nodes.append(helper.make_node("Where", ["mask", "s", "fill"], ["l"]))
        else:
            if form == "runtime":
                inputs["c"] = ([1, 1, 1, 8], F)
                feeds["c"] = r.uniform(-300, 10, [1, 1, 1, 8]).astype(np.float32)
            else:
                inits["c"] = np.array(0.0 if form == "zero" else r.uniform(-150, 10), np.float32)
            flip = bool(r.integers(2))  # Where(not mask, fill, c) as well as Where(mask, c, fill)
            if flip:
                nodes.append(helper.make_node("Not", ["mask"], ["masked"]))
            nodes += [helper.make_node("Where", ["masked", "fill", "c"] if flip else ["mask", "c", "fill"], ["bias"]),
                      helper.make_node("Add", ["bias", "s"] if r.integers(2) else ["s", "bias"], ["l"])]
        nodes.append(helper.make_node("Softmax", ["l"], ["y"], axis=-1))
        results.append(_same_after(_model(nodes, inputs, ["y"], inits), feeds, "mask_fill"))
    _tally(results, "mask_fill")


def _rms_graph(r: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rank = int(r.integers(2, 5))
    shape = [int(d) for d in r.integers(2, 6, rank)]
    axes = sorted(r.choice(rank, int(r.integers(1, rank + 1)), replace=False).tolist())
    if r.random() < 0.5:
        axes = [rank - 1]  # the form the rule fuses, half the time
    axes = [a - rank if r.integers(2) else a for a in axes]
    opset = int(r.choice([13, 18]))
    keepdims = int(r.random() < 0.9)
    scale_shape = [[shape[-1]], [1], [1, shape[-1]], shape[-2:], []][int(r.integers(5))]
    x = "x"
    nodes = []
    inits: dict[str, Any] = {"eps": np.array(r.choice([1e-6, 1e-5, 0.1]), np.float32), "two": np.array(2.0, np.float32),
                             "one": np.array(1.0, np.float32),
                             "scale": r.uniform(0.5, 2, scale_shape).astype(np.float32)}
    if r.random() < 0.15:  # centred first: a LayerNorm, left alone
        nodes += [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]) if opset < 18 else
                  helper.make_node("ReduceMean", ["x", "last"], ["mu"]), helper.make_node("Sub", ["x", "mu"], ["xc"])]
        inits["last"] = np.array([-1], np.int64)
        x = "xc"
    square = helper.make_node("Pow", [x, "two"], ["sq"]) if r.integers(2) else helper.make_node("Mul", [x, x], ["sq"])
    nodes.append(square)
    if opset < 18:
        nodes.append(helper.make_node("ReduceMean", ["sq"], ["ms"], axes=axes, keepdims=keepdims))
    else:
        inits["axes"] = np.array(axes, np.int64)
        nodes.append(helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=keepdims))
    nodes += [helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"])]
    tail = r.integers(3)
    if tail == 0:
        nodes += [helper.make_node("Div", ["one", "rms"], ["inv"]), helper.make_node("Mul", [x, "inv"], ["xn"])]
    elif tail == 1:
        nodes += [helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", ["inv", x], ["xn"])]
    else:
        nodes.append(helper.make_node("Div", [x, "rms"], ["xn"]))
    nodes.append(helper.make_node("Mul", ["xn", "scale"] if r.integers(2) else ["scale", "xn"], ["y"]))
    outputs = ["y"] + (["rms"] if r.random() < 0.15 else [])  # an intermediate read elsewhere too
    x_val = (r.standard_normal(shape) * r.choice([1, 100, 3000])).astype(np.float32)
    return _model(nodes, {"x": (shape, F)}, outputs, inits, opset), {"x": x_val}


def test_rmsnorm_property() -> None:
    """RMSNorm-shaped graphs of rank 2-4: means over random axes (attribute or input), keepdims 0 now and then,
    Pow or Mul squares, the three tails onnxruntime's fusion knows, scales of several shapes, centred inputs, an
    intermediate that is also an output."""
    results = [_same_after(*_rms_graph(_rng("rmsnorm", case)), "rmsnorm") for case in range(CASES * 2)]
    _tally(results, "rmsnorm")


def _moment(r: np.random.Generator, v: str, out: str, axes: list[int], keepdims: int, n: int, opset: int,
            inits: dict[str, Any]) -> list:
    """`out` = a mean of `v` over `axes` as exports write it: ReduceMean, or ReduceSum times 1/N or over N (now
    and then a factor that is not 1/N)."""
    inits["axes"] = np.array(axes, np.int64)
    form = int(r.integers(3))
    if form == 0:
        mean = (helper.make_node("ReduceMean", [v], [out], axes=axes, keepdims=keepdims) if opset < 18 else
                helper.make_node("ReduceMean", [v, "axes"], [out], keepdims=keepdims))
        return [mean]
    count = float(n if r.random() < 0.85 else n + 1)
    inits[f"{out}_k"] = np.array(1 / count if form == 1 else count, np.float32)
    return [helper.make_node("ReduceSum", [v, "axes"], [f"{out}_sum"], keepdims=keepdims),
            helper.make_node("Mul" if form == 1 else "Div", [f"{out}_sum", f"{out}_k"], [out])]


def test_variance_property() -> None:
    """E[x*x] - E[x]^2 over random axes of rank 2-4 tensors, keepdims 0 or 1, ReduceMean or ReduceSum times 1/N
    (or over N; now and then not N), squares as Mul or Pow, now and then the two moments over different axes
    or of different tensors, values offset up to 30 from 0 (the moments form's cancellation in float32 grows
    with the offset: there the centred form is the closer one)."""
    results = []
    for case in range(CASES):
        r = _rng("variance", case)
        rank = int(r.integers(2, 5))
        shape = [int(d) for d in r.integers(2, 6, rank)]
        axes = sorted(r.choice(rank, int(r.integers(1, rank + 1)), replace=False).tolist())
        axes = [a - rank if r.integers(2) else a for a in axes]
        keepdims, opset = int(r.integers(2)), int(r.choice([13, 18]))
        n = math.prod(shape[a] for a in axes)
        inits: dict[str, Any] = {"two": np.array(2.0, np.float32)}
        other = "z" if r.random() < 0.1 else "x"  # the second moment of another tensor: not a variance
        nodes = _moment(r, "x", "m", axes, keepdims, n, opset, inits)
        nodes.append(helper.make_node("Pow", [other, "two"], ["sq"]) if r.integers(2) else
                     helper.make_node("Mul", [other, other], ["sq"]))
        nodes += _moment(r, "sq", "m2", axes, keepdims, n, opset, inits)
        nodes += [helper.make_node("Mul", ["m", "m"], ["mm"]), helper.make_node("Sub", ["m2", "mm"], ["y"])]
        x = (r.standard_normal(shape) * r.choice([1, 10]) + r.choice([0, 3, 30])).astype(np.float32)
        z = (r.standard_normal(shape) * 2).astype(np.float32)
        model = _model(nodes, {"x": (shape, F), "z": (shape, F)}, ["y"], inits, opset)
        # the moments form loses digits to cancellation in float32 (at offset 30, ~1e-4 of the variance)
        results.append(_same_after(model, {"x": x, "z": z}, "variance", bound=1e-3))
    _tally(results, "variance")


def test_gathernd_property() -> None:
    """GatherND on [2-5]^1-4 data with constant indices of 1 to rank components, in and out of range, negative,
    batch_dims 0 or 1."""
    results = []
    for case in range(CASES):
        r = _rng("gathernd", case)
        shape = [int(d) for d in r.integers(2, 6, int(r.integers(1, 5)))]
        k = int(r.integers(1, len(shape) + 1))
        batch = int(len(shape) > k and r.random() < 0.2)
        lead = np.array(shape[batch:batch + k])
        reach = 1 if r.random() < 0.6 else 2  # out of range, a third of the time
        idx = r.integers(-reach * lead, reach * lead, ([shape[0]] if batch else []) + [3, k]).astype(np.int64)
        m = _model([helper.make_node("GatherND", ["x", "idx"], ["y"], batch_dims=batch)], {"x": (shape, F)}, ["y"],
                   {"idx": idx})
        results.append(_same_after(m, {"x": r.standard_normal(shape).astype(np.float32)}, "gathernd"))
    _tally(results, "gathernd")


def test_clip_property() -> None:
    """Clip of x of rank 0-3 (NaN now and then) between bounds that are constants, inputs or computed, of shape
    [], [1], [1, 1] or [2], NaN, or min above max."""
    results = []
    for case in range(CASES * 2):
        r = _rng("clip", case)
        shape = [int(d) for d in r.integers(1, 4, int(r.integers(0, 4)))]
        x = (r.standard_normal(shape) * 3).astype(np.float32)
        if x.size and r.random() < 0.3:
            x.flat[0] = np.nan
        inputs, inits, feeds, nodes, names = {"x": (shape, F)}, {}, {"x": x}, [], []
        for name in ("lo", "hi"):
            kind = r.choice(["none", "constant", "input", "computed"], p=[0.2, 0.2, 0.4, 0.2])
            if kind == "none":
                names.append("")
                continue
            bshape = [[], [1], [1, 1], [2]][int(r.choice(4, p=[0.5, 0.25, 0.15, 0.1]))]
            value = r.uniform(-2, 2, bshape).astype(np.float32)
            if r.random() < 0.2:
                value[...] = np.nan
            if kind == "constant":
                inits[name] = value
            elif kind == "input":
                inputs[name], feeds[name] = (bshape, F), value
            else:  # a floor computed from a runtime value
                inputs[f"{name}_in"], feeds[f"{name}_in"] = (bshape, F), value
                nodes.append(helper.make_node("Neg", [f"{name}_in"], [f"{name}_neg"]))
                nodes.append(helper.make_node("Neg", [f"{name}_neg"], [name]))
            names.append(name)
        while names and not names[-1]:
            names.pop()
        nodes.append(helper.make_node("Clip", ["x", *names], ["y"]))
        results.append(_same_after(_model(nodes, inputs, ["y"], inits, opset=13), feeds, "clip", bound=0.0))
    _tally(results, "clip")


def test_dynamic_int8_property(tmp_path: Path) -> None:
    """onnxruntime's quantize_dynamic over random MLPs (an int8 table read by Gather, two MatMuls), int8 or uint8
    weights, per tensor or per channel, reduce_range or not: where the rule rewrites, the result is the float model
    with the export's weights dequantized (column by column when per channel) to float precision. (Not the int8
    export itself: the per-run activation quantization is what the HTP cannot do; check.py bounds that gap.)"""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    results = []
    for case in range(CASES // 4):
        r = _rng("dynamic_int8", case)
        vocab, emb, hidden, out = (int(v) for v in r.integers(4, 40, 4))
        w = {"table": r.standard_normal((vocab, emb)), "w1": r.standard_normal((emb, hidden)) / 4,
             "w2": r.standard_normal((hidden, out)) / 4}
        nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("MatMul", ["e", "w1"], ["h"]),
                 helper.make_node("Relu", ["h"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["y"])]
        inits = {k: v.astype(np.float32) for k, v in w.items()}
        float_model = _model(nodes, {"ids": ([1, 6], TensorProto.INT64)}, ["y"], inits, opset=17)
        onnx.save(float_model, str(tmp_path / "f.onnx"))
        quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", per_channel=bool(r.integers(2)),
                         reduce_range=bool(r.integers(2)), op_types_to_quantize=["MatMul", "Gather"],
                         weight_type=[QuantType.QInt8, QuantType.QUInt8][int(r.integers(2))])
        rewritten = onnx.load(str(tmp_path / "q.onnx"))
        q = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
        done = legalize(rewritten, ["dynamic_int8"])
        assert done.rewrites == {"dynamic_int8": 2} and not done.kept, done
        dequantized = {k: (q[f"{k}_quantized"].astype(np.float32) - q[f"{k}_zero_point"].astype(np.float32))
                       * q[f"{k}_scale"] for k in w}
        same = _model(nodes, {"ids": ([1, 6], TensorProto.INT64)}, ["y"], dequantized, opset=17)
        feeds = {"ids": r.integers(0, vocab, (1, 6)).astype(np.int64)}
        (a,), (b,) = _outputs(same, feeds), _outputs(rewritten, feeds)
        assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
        results.append(done)
    assert results


def _einsum_terms(r: np.random.Generator) -> str:
    """A two-operand equation: shared (batch or contracted) letters, letters of one side (kept or summed)."""
    letters = iter("abcdefghij")
    a, b, out = [], [], []
    for _ in range(int(r.integers(1, 6))):
        c = next(letters)
        where = r.choice(["both_out", "both_sum", "a_out", "b_out", "a_sum"], p=[0.25, 0.3, 0.2, 0.2, 0.05])
        if where.startswith("both") or where.startswith("a"):
            a.append(c)
        if where.startswith("both") or where.startswith("b"):
            b.append(c)
        if where.endswith("out"):
            out.append(c)
    for side in (a, b, out):
        r.shuffle(side)
    return f"{''.join(a)},{''.join(b)}->{''.join(out)}"


def test_einsum_property() -> None:
    """Random two-operand equations (batch, contracted, free and summed indices in random orders), the second
    operand a constant now and then."""
    results = []
    for case in range(CASES * 2):
        r = _rng("einsum", case)
        eq = _einsum_terms(r)
        size = {c: int(r.integers(2, 5)) for c in "abcdefghij"}
        ta, tb = eq.split("->")[0].split(",")
        a = r.standard_normal([size[c] for c in ta]).astype(np.float32)
        b = r.standard_normal([size[c] for c in tb]).astype(np.float32)
        const = bool(r.integers(2))
        m = _model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=eq)],
                   {"a": (list(a.shape), F), **({} if const else {"b": (list(b.shape), F)})}, ["y"],
                   {"b": b} if const else {}, opset=12)
        results.append(_same_after(m, {"a": a, **({} if const else {"b": b})}, "einsum"))
    assert sum("einsum" in r.rewrites for r in results) and sum("einsum" not in r.rewrites for r in results)


def test_gelu_property() -> None:
    """x * 0.5 * (1 + Erf(x / c)) in the three forms onnxruntime's fusion knows (PyTorch, Keras, TensorFlow), c
    sqrt(2) or off by up to 7e-4 (the fusion's own bound is 1e-3), c as Sqrt(2), x a graph input or the second
    output of a Split."""
    results = []
    for case in range(CASES):
        r = _rng("gelu", case)
        off = float(r.choice([0.0, 0.0, 1e-4, -3e-4, 7e-4]))
        nodes, inits = [], {"one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
        x = "x"
        if r.random() < 0.3:
            nodes.append(helper.make_node("Split", ["pair"], ["first", "second"], axis=0, num_outputs=2))
            x = "second"
        form = r.integers(3)
        if form < 2:
            if r.random() < 0.3 and not off:
                inits["two"] = np.array(2.0, np.float32)
                nodes.append(helper.make_node("Sqrt", ["two"], ["c"]))
            else:
                inits["c"] = np.array(math.sqrt(2) * (1 + off), np.float32)
            nodes.append(helper.make_node("Div", [x, "c"], ["d"]))
        else:
            inits["c"] = np.array(math.sqrt(0.5) * (1 + off), np.float32)
            nodes.append(helper.make_node("Mul", [x, "c"], ["d"]))
        nodes += [helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"])]
        if form == 0:  # PyTorch: (x * 0.5) * (1 + erf)
            nodes += [helper.make_node("Mul", [x, "half"], ["xh"]), helper.make_node("Mul", ["xh", "e1"], ["y"])]
        else:  # Keras / TensorFlow: x * ((1 + erf) * 0.5)
            nodes += [helper.make_node("Mul", ["e1", "half"], ["eh"]), helper.make_node("Mul", [x, "eh"], ["y"])]
        shape = [2, 16]
        inputs = {"pair": ([4, 16], F)} if x == "second" else {"x": (shape, F)}
        value = (r.standard_normal([4, 16] if x == "second" else shape) * 3).astype(np.float32)
        results.append(_same_after(_model(nodes, inputs, ["y"], inits, opset=18), {next(iter(inputs)): value},
                                   "gelu", bound=1e-5))
    _tally(results, "gelu")


def test_convtranspose_property() -> None:
    """ConvTranspose in 1 or 2 spatial dims, dense or grouped, kernels 1-4, strides 1-3, dilations 1-2, pads and
    output_padding at random (output_padding below the stride or dilation, as onnxruntime requires)."""
    results = []
    for case in range(CASES):
        r = _rng("convtranspose", case)
        dims = int(r.integers(1, 3))
        channels = int(r.choice([2, 4]))
        group = int(r.choice([1, 2, channels]))
        kernel = [int(k) for k in r.integers(1, 5, dims)]
        strides = [int(s) for s in r.integers(1, 4, dims)]
        dilations = [int(d) for d in r.integers(1, 3, dims)]
        out_pad = [int(r.integers(0, max(s, d))) for s, d in zip(strides, dilations)]
        pads = [int(p) for p in r.integers(0, 3, 2 * dims)]
        w = r.standard_normal([channels, channels // group, *kernel]).astype(np.float32)
        shape = [1, channels] + [int(d) for d in r.integers(3, 7, dims)]
        m = _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=group, kernel_shape=kernel,
                                     strides=strides, dilations=dilations, pads=pads, output_padding=out_pad)],
                   {"x": (shape, F)}, ["y"], {"w": w}, opset=17)
        results.append(_same_after(m, {"x": r.standard_normal(shape).astype(np.float32)}, "convtranspose", bound=0.0))
    assert sum("convtranspose" in r.rewrites for r in results) and sum(not r.rewrites for r in results)


def test_qdq_unsigned_property() -> None:
    """QuantizeLinear -> DequantizeLinear pairs with int8 or int16 zero points (anywhere in their range, per
    tensor or per axis), read by DequantizeLinear nodes with the same or another zero point, by another op
    (Identity of the integers), or a graph output; inputs that saturate: exact wherever rewritten."""
    results = []
    for case in range(CASES):
        r = _rng("qdq_unsigned", case)
        dtype = [np.int8, np.int16][int(r.integers(2))]
        info = np.iinfo(dtype)
        per_axis = r.random() < 0.3
        n = 4 if per_axis else 1
        zero = r.integers(info.min, info.max, size=n if per_axis else ()).astype(dtype)
        scale = (r.random(n if per_axis else ()) * 0.05 + 1e-3).astype(np.float32)
        inits = {"s": scale, "z": zero, "z2": (zero.astype(np.int32) // 2).astype(dtype)}
        axis = {"axis": 1} if per_axis else {}
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **axis),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **axis)]
        outputs = ["y"]
        odd = r.integers(4)
        if odd == 1:  # another zero point dequantizes it: left
            nodes.append(helper.make_node("DequantizeLinear", ["q", "s", "z2"], ["y2"], **axis))
            outputs.append("y2")
        elif odd == 2:  # the integers read by another op: left
            nodes += [helper.make_node("Identity", ["q"], ["qi"]),
                      helper.make_node("DequantizeLinear", ["qi", "s", "z"], ["y2"], **axis)]
            outputs.append("y2")
        model = _model(nodes, {"x": ([2, n, 3], F)}, outputs, inits)
        feeds = {"x": (r.standard_normal((2, n, 3)) * float(r.choice([0.1, 1.0, 50.0]))).astype(np.float32)}
        results.append(_same_after(model, feeds, "qdq_unsigned", bound=0.0))
    _tally(results, "qdq_unsigned")


def test_batchnorm_params_property() -> None:
    """BatchNormalization whose parameters come from DequantizeLinear of int8/uint8/int16/int32 constants (per tensor or
    per channel, with and without a zero point), from a runtime tensor, or with another DequantizeLinear
    attribute: exact wherever folded."""
    results = []
    for case in range(CASES):
        r = _rng("batchnorm_params", case)
        c = 3
        dtype = [np.int8, np.uint8, np.int16, np.int32][int(r.integers(4))]
        info = np.iinfo(np.int16 if dtype == np.int32 else dtype)  # int32: a bias, values well inside the type
        per_axis = r.random() < 0.4
        n = c if per_axis else 1
        shape = (n,) if per_axis else ()
        inits: dict[str, np.ndarray] = {
            "q": r.integers(info.min, info.max, size=c).astype(dtype),
            "s": (r.random(shape) * 0.01 + 1e-3).astype(np.float32),
            "z": r.integers(info.min // 4, info.max // 4, size=shape).astype(dtype),
            "b": r.standard_normal(c).astype(np.float32), "m": r.standard_normal(c).astype(np.float32),
            "v": (r.random(c) + 0.5).astype(np.float32)}
        inputs = {"x": ([2, c, 4], F)}
        dq_inputs = ["q", "s"] + (["z"] if r.random() < 0.7 else [])
        odd = r.integers(4)
        if odd == 1:  # the quantized data is a runtime input: left alone (not a constant)
            del inits["q"]
            inputs["q"] = ([c], {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8,
                                 np.int16: TensorProto.INT16, np.int32: TensorProto.INT32}[dtype])
        attrs = {"axis": 0} if per_axis else {}
        if odd == 2 and case % 2:  # opset 21's block_size: left with its reason
            attrs["block_size"] = 0
        nodes = [helper.make_node("DequantizeLinear", dq_inputs, ["gamma"], **attrs),
                 helper.make_node("BatchNormalization", ["x", "gamma", "b", "m", "v"], ["y"])]
        model = _model(nodes, inputs, ["y"], inits, opset=21)
        feeds = {"x": r.standard_normal((2, c, 4)).astype(np.float32)}
        if "q" in inputs:
            feeds["q"] = r.integers(info.min, info.max, size=c).astype(dtype)
        results.append(_same_after(model, feeds, "batchnorm_params", bound=1e-6))
    _tally(results, "batchnorm_params")
