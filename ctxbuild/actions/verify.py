"""verify: run the compiled `_ctx.onnx` on the HTP simulator and the float model on the CPU EP, compare.

Metrics per output, over all samples together:
- cosine similarity; when the reference and the result are both (numerically) zero it is 1, when only
  one of them is, 0: never NaN, never a pass for a result that is all zeros against a real signal;
- SNR in dB, 10*log10(sum(ref^2) / sum((ref - got)^2)), clamped to +-SNR_CAP_DB (an exact match is
  +cap, noise against a zero reference is -cap);
- max and mean absolute error; argmax agreement for classifier-shaped outputs ([N, classes]).
The simulator runs in a forked child with a timeout: a crash or hang in the QNN library fails this
action with a clear line, never the worker, ninja or the driver.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import output_slices, quantized_io, toolchain
from ..action import Action
from ..errors import ActionError
from .compile import compile_refusal
from .modelio import load
from .samples import from_files, input_spec, list_samples, random_samples
from .verify_memo import OutputsMemo, wrapper_identity

if TYPE_CHECKING:  # imported where used: the cache-hit path (listing samples, warnings) needs no numpy
    import numpy as np

SNR_CAP_DB = 120.0
_ZERO_POWER = 1e-20


def discover_inputs(action: Action) -> dict[str, Path]:
    if not action.watch:
        return {}
    return list_samples(Path(action.watch[0]), action.params["samples"], action.recipe_files[0])


def warnings(action: Action) -> list[str]:
    if action.params["sample_source"] == "random":
        return [f"{action.description}: no verification or calibration samples; verifying on seeded random "
                "data (set verify.dir to real inputs)"]
    return []


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text())}


def run(ctx: Any) -> None:
    a = ctx.action
    p = a.params
    if refused := compile_refusal({k.removeprefix("ctx."): v for k, v in a.inputs.items() if k.startswith("ctx.")}):
        result = {"graph": p["graph"], "method": p["method"], "outputs": {}, "compile_refused": refused}
        Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
        return  # a search candidate QNN would not compile: nothing to measure, the select action says so
    ref_model = Path(a.inputs["reference"])
    ref_proto = load(ref_model, external_data=False)
    spec = input_spec(ref_proto)
    samples = list(random_samples(spec, p["samples"]) if p["sample_source"] == "random"
                   else from_files(spec, discover_inputs(a), a.recipe_files[0]))
    # What the memoized outputs depend on: content digests the runner already computed for the action key.
    key = ctx.key_components
    inputs = key["inputs"]
    sample_id = [p["sample_source"], p["samples"], p["inputs"], key["discovered_inputs"],
                 inputs["reference"] if p["sample_source"] == "random" else None]
    memo = OutputsMemo(ctx.cache, ctx.tmp)
    start = time.monotonic()
    reference = memo.get_or_compute("reference", [inputs["reference"], inputs.get("reference.data"), sample_id,
                                                   key["toolchain"]["onnxruntime"]],
                                    lambda: _cpu_outputs(ref_model, samples))
    ctx.facts["reference_seconds"] = round(time.monotonic() - start, 3)
    start = time.monotonic()
    timing: dict[str, float] = {}
    # split_outputs: the wrapper re-joins the parts with a Concat on the CPU.
    cpu_fallback = p["cpu_fallback"] or bool(p.get("split_outputs"))
    got = memo.get_or_compute(
        "simulator", [wrapper_identity(Path(a.inputs["ctx.ctx"])), inputs.get("ctx.bin"), sample_id,
                      cpu_fallback, key["toolchain"]],
        lambda: simulate(Path(a.inputs["ctx.ctx"]), samples, cpu_fallback=cpu_fallback,
                         timeout=p["timeout_s"], timing=timing))
    # Timings go to the record, not the result file: the file must be the same bytes on every run.
    ctx.facts["simulator_seconds"] = round(time.monotonic() - start, 3)
    ctx.facts.update({f"simulator_{k}_seconds": round(v, 3) for k, v in timing.items()})
    ctx.facts.update(memo_hits=memo.hits, memo_keys=memo.keys)
    result: dict[str, Any] = {
        "graph": p["graph"], "method": p["method"], "samples": len(samples), "sample_source": p["sample_source"],
        "outputs": {name: metrics(reference[name], got[name]) for name in reference},
        "coverage": coverage(Path(a.inputs["ctx.ctx"]), Path(a.inputs["compiled"])),
    }
    for name, s in output_slices.find(ref_proto, p.get("slices")).items():
        per_slice = output_slices.measure(reference[name], got[name], s, metrics) if name in reference else None
        if per_slice:
            result["outputs"][name]["slices"] = per_slice
    if "bundle.ctx" in a.inputs:
        result["bundle_signature_match"] = _same_signature(Path(a.inputs["bundle.ctx"]), Path(a.inputs["ctx.ctx"]))
    if not p.get("gate", True):  # a search candidate: measured here, judged by the select action
        Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
        return
    result["thresholds"] = p["thresholds"]
    found = failures(result)
    result["passed"] = not found
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    if found:
        raise ActionError(f"{p['graph']}@{a.target['name']}: " + "; ".join(found), details=result,
                          hint=_hint(a, ref_model, samples, reference, result))


def _hint(a: Action, ref_model: Path, samples: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray],
          result: dict[str, Any]) -> str:
    """Where the accuracy went (quantization or the HTP) and the likely fix: diagnose.py, CPU side only."""
    from ..diagnose import failure_hint

    return failure_hint(ref_model, Path(a.inputs["compiled"]), samples, reference, result,
                        recipe=a.recipes[0], precision=a.params["precision"])


def metrics(ref: np.ndarray, got: np.ndarray) -> dict[str, float | None]:
    import numpy as np

    r = ref.astype(np.float64).ravel()
    g = got.astype(np.float64).reshape(ref.shape).ravel()
    p_ref, p_got, p_err = float(r @ r), float(g @ g), float((r - g) @ (r - g))
    if p_ref <= _ZERO_POWER and p_got <= _ZERO_POWER:
        cosine = 1.0
    elif p_ref <= _ZERO_POWER or p_got <= _ZERO_POWER:
        cosine = 0.0
    else:
        cosine = float(r @ g / np.sqrt(p_ref * p_got))
    if p_err <= _ZERO_POWER:
        snr = SNR_CAP_DB
    elif p_ref <= _ZERO_POWER:
        snr = -SNR_CAP_DB
    else:
        snr = float(np.clip(10 * np.log10(p_ref / p_err), -SNR_CAP_DB, SNR_CAP_DB))
    diff = np.abs(r - g)
    argmax = None
    if ref.ndim == 2 and ref.shape[1] > 1:  # [N, classes]: N samples stacked
        argmax = float(np.mean(ref.argmax(1) == got.reshape(ref.shape).argmax(1)))
    return {"cosine": round(cosine, 6), "snr_db": round(snr, 3), "max_abs": float(diff.max()),
            "mean_abs": float(diff.mean()), "argmax_agreement": argmax}


def failures(result: dict[str, Any]) -> list[str]:
    t = result["thresholds"]
    out = []
    for name, m in result["outputs"].items():
        if not (m["cosine"] >= t["min_cosine"] and m["snr_db"] >= t["min_snr_db"]):  # NaN fails too
            out.append(f"output '{name}' cosine {m['cosine']:.4f} (min {t['min_cosine']}), "
                       f"SNR {m['snr_db']:.1f} dB (min {t['min_snr_db']})")
        for sl in m.get("slices") or []:
            if not (sl["cosine"] >= t["min_cosine"] and sl["snr_db"] >= t["min_snr_db"]):
                out.append(f"output '{name}' slice {sl['start']}:{sl['stop']} ({sl['slice']}, values up to "
                           f"{sl['range']:.3g}) cosine {sl['cosine']:.4f}, SNR {sl['snr_db']:.1f} dB")
    if result.get("bundle_signature_match") is False:
        out.append("the bundle's graph has different inputs/outputs than its single-graph build")
    return out


def _cpu_outputs(model: Path, samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3  # a LoRA reference's slots are overridable initializers: ORT warns per session
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(None, s) for s in samples]
    return {n: np.concatenate([r[i] for r in runs]) for i, n in enumerate(names)}


def simulate(ctx_model: Path, samples: list[dict[str, np.ndarray]], *, cpu_fallback: bool,
             timeout: float, timing: dict[str, float] | None = None,
             adapter: Path | None = None) -> dict[str, np.ndarray]:
    """Run on the simulator in a child process (one session for all samples); its crash or hang becomes an
    ActionError here. `timing` receives the child's session load and run seconds. `adapter`: an
    `.onnx_adapter` bound to every run (RunOptions.add_active_adapter)."""
    import multiprocessing

    mp = multiprocessing.get_context("fork")  # the parent already imported onnxruntime: fork is cheap
    recv, send = mp.Pipe(duplex=False)
    child = mp.Process(target=_simulate_child, args=(ctx_model, samples, cpu_fallback, send, adapter), daemon=True)
    child.start()
    send.close()
    result = None
    if recv.poll(timeout):
        try:
            result = recv.recv()
        except EOFError:
            result = None
    child.join(5 if result is not None else 0)
    if child.is_alive():
        child.kill()
        child.join()
        if result is None:
            raise ActionError(f"{ctx_model.name}: the HTP simulator did not finish within {timeout:g} s",
                              "raise verify.timeout_s, or verify fewer samples")
    if result is None:
        raise ActionError(f"{ctx_model.name}: the HTP simulator crashed (exit {child.exitcode}) running the "
                          "context binary", "the binary may be corrupt; rebuild it (see the log)")
    if isinstance(result, str):
        raise ActionError(f"{ctx_model.name}: the HTP simulator failed: {result}")
    outputs, times = result
    if timing is not None:
        timing.update(times)
    return outputs


def _simulate_child(ctx_model: Path, samples: list[dict[str, np.ndarray]], cpu_fallback: bool, send: Any,
                    adapter: Path | None = None) -> None:
    import numpy as np
    import onnxruntime as ort

    try:
        start = time.monotonic()
        so = toolchain.session_options({}, cpu_fallback=cpu_fallback)
        sess = ort.InferenceSession(str(ctx_model), so)
        loaded = time.monotonic()
        names = [o.name for o in sess.get_outputs()]
        # compile.quantized_io: float samples in, float outputs out, through the recorded encodings
        enc = json.loads(sess.get_modelmeta().custom_metadata_map.get(quantized_io.KEY, "{}"))
        samples = [{k: quantized_io.quantize(v, enc[k]) if k in enc else v for k, v in s.items()} for s in samples]
        ro = None
        if adapter is not None:
            lora = ort.LoraAdapter()
            lora.Load(str(adapter))
            ro = ort.RunOptions()
            ro.add_active_adapter(lora)
        runs = [sess.run(None, s, ro) for s in samples]
        times = {"load": loaded - start, "run": time.monotonic() - loaded}
        got = {n: np.concatenate([r[i] for r in runs]) for i, n in enumerate(names)}
        send.send(({n: quantized_io.dequantize(v, enc[n]) if n in enc else v for n, v in got.items()}, times))
    except Exception as e:  # noqa: BLE001 - report ORT's message to the parent as one line
        send.send(str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__)


def coverage(ctx_model: Path, compiled: Path) -> dict[str, Any]:
    """Nodes that ran on QNN vs stayed on the CPU: nodes of the compiled model not absorbed into EPContext."""
    import onnx

    wrapper = onnx.load(str(ctx_model), load_external_data=False)
    cpu = sum(1 for n in wrapper.graph.node if n.op_type != "EPContext")
    total = len(load(compiled, external_data=False).graph.node)
    qnn = max(total - cpu, 0)
    return {"qnn_nodes": qnn, "cpu_nodes": cpu, "fraction": round(qnn / total, 4) if total else 1.0}


def _same_signature(bundle_ctx: Path, single_ctx: Path) -> bool:
    """The bundle's copy of a graph must have the I/O of the single-graph build that was verified."""
    from ..contextbin import describe

    def signature(ctx_path: Path) -> list[Any]:
        info = describe(ctx_path)
        part = _partition(ctx_path)
        graphs = [g for b in info["binaries"] for g in b["graphs"]]
        graph = next((g for g in graphs if g["name"] == part), None)
        if graph is None:
            raise ActionError(f"{ctx_path.name}: graph '{part}' not found in its context binary")
        # A bundle's binary names I/O `<graph>__<name>` (see actions/bundle.py); compare the names users see.
        return [[(t["name"].split("__", 1)[-1], t["dtype"], t["dims"]) for t in graph[k]] for k in ("inputs", "outputs")]

    return signature(bundle_ctx) == signature(single_ctx)


def _partition(ctx_path: Path) -> str:
    import onnx

    model = onnx.load(str(ctx_path), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "EPContext")
    return next(a.s.decode() for a in node.attribute if a.name == "partition_name")
