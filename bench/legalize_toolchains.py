"""Which published onnxruntime-qnn releases need each legalization rule, measured: for every rule a small probe
model with the pattern it rewrites, at the precision where the rule matters, built by ctxbuild with the rule off
(`prepare: {rewrite: false}`) and, as the control, with it alone on (`rewrite: [rule]`; a probe that needs other
rules to compile at all, ALONGSIDE, has them on in both), with `toolchain: "X.Y.Z"`
for each release (provisioned on demand), SM8650, verified on that release's simulator against the user's model
(the recipe's default thresholds). A release handles a rule's pattern itself when the probe compiles and passes
verification with the rule off; ctxbuild/graph/legalize/toolchains.py (HANDLED) is read off this table, and only
for rules whose probe fails with the rule off on some release (else the probe does not show the problem).

Usage: python bench/legalize_toolchains.py [--releases 2.3.0 2.7.0] [--rules gelu clip]
Prints a markdown table and writes bench/results/legalize_toolchains.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ctxbuild.toolchain.runtimes import PUBLISHED  # noqa: E402

IR_VERSION = 10


def _rng() -> Any:
    import numpy as np

    return np.random.default_rng(18)


def _model(nodes: list, inputs: dict[str, list[int]], outputs: dict[str, list[int]], inits: dict[str, Any],
           opset: int = 17) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in outputs.items()],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def _floats(name: str, shape: list[int], scale: float = 1.0) -> dict[str, Any]:
    return {name: lambda g: (g.standard_normal(shape) * scale).astype("float32")}


def einsum() -> tuple[Any, dict[str, Any]]:
    """DeepFilterNet's grouped linear layer: an Einsum the EP does not map."""
    from onnx import helper

    w = _rng().standard_normal((4, 8, 6)).astype("float32")
    return _model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="btgi,gih->btgh")],
                  {"a": [1, 10, 4, 8]}, {"y": [1, 10, 4, 6]}, {"b": w}, opset=12), _floats("a", [1, 10, 4, 8])


def gathernd() -> tuple[Any, dict[str, Any]]:
    """GatherND on a boolean mask with constant indices (a BERT-style mask expansion)."""
    import numpy as np
    from onnx import TensorProto, helper

    idx = np.array([[[0, 4], [1, 3]], [[1, 2], [0, 0]]], np.int64)
    nodes = [helper.make_node("Greater", ["x", "zero"], ["mask"]), helper.make_node("GatherND", ["mask", "idx"], ["g"]),
             helper.make_node("Cast", ["g"], ["c"], to=TensorProto.FLOAT), helper.make_node("Add", ["c", "x1"], ["y"])]
    return _model(nodes, {"x": [2, 5, 3]}, {"y": [2, 2, 3]},
                  {"idx": idx, "zero": np.array(0.0, np.float32), "x1": np.full((2, 2, 3), 0.5, np.float32)}), \
        _floats("x", [2, 5, 3])


def clip() -> tuple[Any, dict[str, Any]]:
    """A clamp whose floor is computed (a mel front end's max(x, max(x) - 8))."""
    import numpy as np
    from onnx import helper

    nodes = [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0), helper.make_node("Sub", ["top", "range"], ["floor"]),
             helper.make_node("Clip", ["x", "floor", "ceil"], ["y"])]
    return _model(nodes, {"x": [1, 16, 20]}, {"y": [1, 16, 20]},
                  {"range": np.array(8.0, np.float32), "ceil": np.array(30.0, np.float32)}), _floats("x", [1, 16, 20], 10)


def dynamic_int8() -> tuple[Any, dict[str, Any]]:
    """onnxruntime's quantize_dynamic output of an embedding + MLP (an int8 Gather table, DynamicQuantizeLinear +
    MatMulInteger)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    r = _rng()
    inits = {"table": r.standard_normal((100, 64)), "w1": r.standard_normal((64, 128)) / 8,
             "w2": r.standard_normal((128, 32)) / 11}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]), helper.make_node("MatMul", ["emb", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 32])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    with tempfile.TemporaryDirectory() as d:
        onnx.save(m, f"{d}/f.onnx")
        quantize_dynamic(f"{d}/f.onnx", f"{d}/q.onnx", weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gather"])
        return onnx.load(f"{d}/q.onnx"), {"ids": lambda g: g.integers(0, 100, (1, 12)).astype(np.int64)}


def rmsnorm() -> tuple[Any, dict[str, Any]]:
    """T5's RMSNorm written out after a projection whose outputs reach ~3e3: the square overflows fp16."""
    import numpy as np
    from onnx import helper

    r = _rng()
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Pow", ["h", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["one", "rms"], ["inv"]), helper.make_node("Mul", ["h", "inv"], ["hn"]),
             helper.make_node("Mul", ["scale", "hn"], ["y"])]
    return _model(nodes, {"x": [1, 16, 64]}, {"y": [1, 16, 64]},
                  {"w": (r.standard_normal((64, 64)) * 400).astype(np.float32), "two": np.array(2.0, np.float32),
                   "axes": np.array([-1], np.int64), "eps": np.array(1e-6, np.float32), "one": np.array(1.0, np.float32),
                   "scale": (1 + r.standard_normal(64) / 10).astype(np.float32)}, opset=18), _floats("x", [1, 16, 64])


def gelu() -> tuple[Any, dict[str, Any]]:
    """PyTorch's exact GELU (Erf) after a MatMul."""
    import numpy as np
    from onnx import helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Div", ["h", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["h", "e1"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    return _model(nodes, {"x": [1, 16, 64]}, {"y": [1, 16, 64]},
                  {"w": (_rng().standard_normal((64, 64)) / 8).astype(np.float32), "sqrt2": np.array(2 ** 0.5, np.float32),
                   "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}), _floats("x", [1, 16, 64])


def mask_fill() -> tuple[Any, dict[str, Any]]:
    """Attention logits plus Where(mask, 0, float32 min) into Softmax, as torch's SDPA export writes it (the mask an
    input: a constant one is folded before the rules run)."""
    import numpy as np
    from onnx import TensorProto, helper

    r = _rng()
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Where", ["mask", "zero", "fill"], ["bias"]), helper.make_node("Add", ["ss", "bias"], ["l"]),
             helper.make_node("Softmax", ["l"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    m = _model(nodes, {"q": [1, 2, 16, 32]}, {"y": [1, 2, 16, 32]},
               {"kt": r.standard_normal((1, 2, 32, 16)).astype(np.float32), "scale": np.array(32 ** -0.5, np.float32),
                "zero": np.array(0.0, np.float32), "fill": np.array(np.finfo(np.float32).min, np.float32),
                "v": r.standard_normal((1, 2, 16, 32)).astype(np.float32)})
    m.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, 1, 16]))
    return m, {"q": lambda g: (g.standard_normal((1, 2, 16, 32)) * 2).astype(np.float32),
               "mask": lambda g: np.arange(16).reshape(1, 1, 1, 16) < 11}  # 5 padding keys


def convtranspose() -> tuple[Any, dict[str, Any]]:
    """A depthwise ConvTranspose with output_padding (DeepFilterNet3's ERB decoder)."""
    from onnx import helper

    w = _rng().standard_normal((16, 1, 1, 3)).astype("float32")
    return _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=16, kernel_shape=[1, 3], strides=[1, 2],
                                    pads=[0, 1, 0, 1], output_padding=[0, 1])],
                  {"x": [1, 16, 20, 8]}, {"y": [1, 16, 20, 16]}, {"w": w}), _floats("x", [1, 16, 20, 8])



def sum_squares() -> tuple[Any, dict[str, Any]]:
    """A power spectrum as onnx-asr's log-mel front ends write it: ReduceSumSquare over real and imaginary parts."""
    from onnx import helper

    return _model([helper.make_node("ReduceSumSquare", ["x"], ["y"], axes=[1], keepdims=0)], {"x": [1, 2, 33, 10]},
                  {"y": [1, 33, 10]}, {}), _floats("x", [1, 2, 33, 10])


def log_power() -> tuple[Any, dict[str, Any]]:
    """Whisper's log-mel after its STFT: |re|^2 + |im|^2 (Mul, ReduceSum), a mel filter bank (columns summing to
    ~0.025, Slaney's normalization), Log(Clip(mel, 1e-10)); the spectra roll off 80 dB over frequency and start
    with digital silence, at a loud and a quiet level (fp16 flushes the quiet squares, its floor is 0)."""
    import numpy as np
    from onnx import helper

    bank = np.zeros((65, 16), np.float32)
    for j, k in enumerate(np.linspace(2, 62, 16).astype(int)):
        bank[k - 2:k + 3, j] = np.array([1, 2, 3, 2, 1], np.float32) / 9 * 0.025
    nodes = [helper.make_node("Mul", ["spec", "spec"], ["sq"]), helper.make_node("ReduceSum", ["sq", "axis"], ["power"],
                                                                                   keepdims=0),
             helper.make_node("Transpose", ["power"], ["frames"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["frames", "bank"], ["mel"]),
             helper.make_node("Clip", ["mel", "lo"], ["floored"]), helper.make_node("Log", ["floored"], ["y"])]
    roll = 10 ** (-4 * np.arange(65) / 64)[None, None, :, None]

    def spectra(g: Any) -> Any:
        spec = g.standard_normal((1, 2, 65, 50)) * roll * g.choice([30.0, 0.05])
        spec[..., :10] = 0
        return spec.astype(np.float32)

    return _model(nodes, {"spec": [1, 2, 65, 50]}, {"y": [1, 50, 16]},
                  {"axis": np.array([1], np.int64), "bank": bank, "lo": np.array(1e-10, np.float32)}), {"spec": spectra}


def moments_norm(rows: int, features: int, factor: float) -> Any:
    """A LayerNorm as JAX writes it (Magika's export): variance = Max(0, E[x*x] - E[x]^2), the moments ReduceSum
    times `factor` (1/N for a true mean), keepdims 0, then (x - mean) / sqrt(variance + eps)."""
    import numpy as np
    from onnx import helper

    nodes = [helper.make_node("ReduceSum", ["x", "last"], ["s1"], keepdims=0),
             helper.make_node("Mul", ["s1", "inv_n"], ["mean"]),
             helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("ReduceSum", ["sq", "last"], ["s2"], keepdims=0),
             helper.make_node("Mul", ["s2", "inv_n"], ["m2"]), helper.make_node("Mul", ["mean", "mean"], ["mean_sq"]),
             helper.make_node("Sub", ["m2", "mean_sq"], ["var"]), helper.make_node("Max", ["zero", "var"], ["var0"]),
             helper.make_node("Unsqueeze", ["var0", "last"], ["var1"]),
             helper.make_node("Unsqueeze", ["mean", "last"], ["mean1"]),
             helper.make_node("Add", ["var1", "eps"], ["var_eps"]), helper.make_node("Sqrt", ["var_eps"], ["std"]),
             helper.make_node("Reciprocal", ["std"], ["inv_std"]), helper.make_node("Sub", ["x", "mean1"], ["xc"]),
             helper.make_node("Mul", ["xc", "inv_std"], ["y"])]
    return _model(nodes, {"x": [1, rows, features]}, {"y": [1, rows, features]},
                  {"last": np.array([-1], np.int64), "inv_n": np.array(factor, np.float32),
                   "zero": np.array(0.0, np.float32), "eps": np.array(1e-6, np.float32)})


def variance() -> tuple[Any, dict[str, Any]]:
    """The moments LayerNorm over 512 features of activations up to ~170: the sum of squares passes fp16's 65504."""
    import numpy as np

    return moments_norm(8, 512, 1 / 512), {
        "x": lambda g: (np.abs(g.standard_normal((1, 8, 512))) * 40 + 5).astype(np.float32)}


def qdq_bias() -> tuple[Any, dict[str, Any]]:
    """quantize_static's QDQ export (its defaults: signed int8, per tensor) of a depthwise Conv whose weight and
    bias are Constant nodes, as paddle2onnx writes them: the bias stays float."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    r, c = _rng(), 8
    nodes = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v.astype(np.float32), k))
             for k, v in (("w", r.standard_normal((c, 1, 3, 3)) * 0.3), ("b", r.standard_normal(c)))]
    nodes.append(helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], group=c))
    samples = iter([{"x": r.standard_normal((1, c, 16, 16)).astype(np.float32)} for _ in range(4)])

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, Any] | None:
            return next(samples, None)

    with tempfile.TemporaryDirectory() as d:
        onnx.save(_model(nodes, {"x": [1, c, 16, 16]}, {"y": [1, c, 16, 16]}, {}, opset=13), f"{d}/f.onnx")
        quantize_static(f"{d}/f.onnx", f"{d}/q.onnx", Reader(), quant_format=QuantFormat.QDQ)
        return onnx.load(f"{d}/q.onnx"), _floats("x", [1, c, 16, 16])


# rule -> (probe, the precisions where the rule matters: where the HTP refuses the pattern or computes it wrongly)
PROBES: dict[str, tuple[Callable[[], tuple[Any, dict[str, Any]]], tuple[str, ...]]] = {
    "einsum": (einsum, ("fp16",)), "gathernd": (gathernd, ("fp16",)), "clip": (clip, ("fp16", "int16")),
    "dynamic_int8": (dynamic_int8, ("fp16",)), "rmsnorm": (rmsnorm, ("fp16",)), "gelu": (gelu, ("int16", "int8")),
    "mask_fill": (mask_fill, ("int16",)), "convtranspose": (convtranspose, ("fp16",)),
    "sum_squares": (sum_squares, ("fp16",)), "log_power": (log_power, ("fp16",)), "variance": (variance, ("fp16",)),
    "qdq_bias": (qdq_bias, ("qdq",)),
}
# rule -> the rules its probe is built with, off and on alike: the HTP takes a quantize_static export only once
# its weights are constants and its activations unsigned (what qdq_bias fixes is then all that is left)
ALONGSIDE: dict[str, tuple[str, ...]] = {"qdq_bias": ("qdq_weights", "qdq_unsigned")}


def write_tree(tree: Path, rules: list[str], release: str) -> list[str]:
    """One recipe per rule, precision and rule off/on; the recipe names."""
    import numpy as np
    import onnx

    names = []
    for rule in rules:
        make, precisions = PROBES[rule]
        model, samplers = make()
        models = tree / "models"
        (models / "calib" / rule).mkdir(parents=True, exist_ok=True)
        onnx.save(model, models / f"{rule}.onnx")
        g = np.random.default_rng(7)
        for i in range(4):
            np.savez(models / "calib" / rule / f"sample_{i:03d}.npz", **{k: f(g) for k, f in samplers.items()})
        for precision in precisions:
            for on in (False, True):
                name = f"{rule}_{precision}_{'on' if on else 'off'}"
                rewrite = [*ALONGSIDE.get(rule, ()), *([rule] if on else [])]
                (tree / f"{name}.yaml").write_text(
                    f"model: models/{rule}.onnx\nprecision: {precision}\ncalibration: {{dir: models/calib/{rule}}}\n"
                    f"targets: [SM8650]\nprepare: {{rewrite: {json.dumps(rewrite) if rewrite else 'false'}}}\n"
                    f'toolchain: "{release}"\n')
                names.append(name)
    return names


def outcome(out: Path, name: str) -> dict[str, Any]:
    """What the build did with one probe recipe (from its records): compiled, verified (passed, cosine), or why
    not; and what prepare rewrote."""
    records = out / ".ctxbuild" / "records"
    prepared = next(json.loads(f.read_text()) for f in records.glob("prepare.*.json")
                    if name in json.loads(f.read_text())["recipes"])
    r: dict[str, Any] = {"rewrites": prepared.get("rewrites", {}), "withdrawn": prepared.get("withdrawn", {})}
    compiled = json.loads((records / f"compile.{name}@SM8650.json").read_text())
    if compiled["status"] != "ok":
        return {**r, "compiled": False, "error": compiled.get("cause", "")[:300]}
    verified = json.loads((records / f"verify.{name}@SM8650.json").read_text()).get("result")
    if not verified:
        return {**r, "compiled": True, "verified": False}
    return {**r, "compiled": True, "verified": True, "passed": verified["passed"],
            "cosine": min(o["cosine"] for o in verified["outputs"].values())}


def measure(release: str, rules: list[str], work: Path) -> dict[str, Any]:
    tree, out = work / "recipes", work / "out"
    names = write_tree(tree, rules, release)
    env = {**{k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}, "CTXBUILD_CACHE_DIR": str(work / "cache")}
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(tree), "-o", str(out), "-k", "0"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    (work / "build.log").write_text(p.stdout + p.stderr)
    return {name: outcome(out, name) for name in names}


def cell(r: dict[str, Any]) -> str:
    if not r.get("compiled"):
        return "refused"
    if not r.get("verified"):
        return "compiled, not verified"
    cos = f" (cosine {r['cosine']:.3f})" if r.get("cosine") is not None else ""
    return ("passes" if r["passed"] else "fails") + cos


def table(results: dict[str, dict[str, Any]]) -> str:
    releases = list(results)
    lines = ["| rule, precision | " + " | ".join(f"{r} ({PUBLISHED[r]}) off / on" for r in releases) + " |",
             "|---|" + "---|" * len(releases)]
    names = sorted({n.rsplit("_", 1)[0] for rows in results.values() for n in rows})
    for base in names:
        lines.append(f"| {base.rsplit('_', 1)[0]}, {base.rsplit('_', 1)[1]} | " + " | ".join(
            f"{cell(results[r][base + '_off'])} / {cell(results[r][base + '_on'])}" for r in releases) + " |")
    return "\n".join(lines)


def off_table(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """ctxbuild/graph/legalize/toolchains.py's OFF: per rule and release, the probe with the rule off (of several
    precisions, the worst)."""
    worst = ("passes", "compiled, not verified", "fails", "refused")
    off: dict[str, dict[str, str]] = {}
    for release, rows in results.items():
        for name, r in rows.items():
            if name.endswith("_off"):
                rule = name.rsplit("_", 2)[0]
                have, new = off.setdefault(rule, {}).get(release), cell(r)
                if have is None or worst.index(new.split(" (")[0]) > worst.index(have.split(" (")[0]):
                    off[rule][release] = new
    return off


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", nargs="*", default=list(PUBLISHED))
    ap.add_argument("--rules", nargs="*", default=list(PROBES))
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "legalize_toolchains.json")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ctxbuild-legalize-") as tmp:
        for release in args.releases:
            results[release] = measure(release, args.rules, Path(tmp) / release)
            print(f"{release}: {json.dumps(results[release])}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if args.json.exists():  # a partial run (--rules, --releases) keeps the other measurements
        old = json.loads(args.json.read_text())
        results = {r: {**old.get(r, {}), **results.get(r, {})} for r in PUBLISHED if r in old or r in results}
    args.json.write_text(json.dumps(results, indent=1))
    print(table(results))
    print(json.dumps(off_table(results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
