"""Measuring a compiled graph: the float model on the CPU EP, the compiled one on the HTP simulator (in a
forked child with a timeout), and the metrics that compare them.

Metrics per output, over all samples together:
- cosine similarity; when the reference and the result are both (numerically) zero it is 1, when only
  one of them is, 0: never NaN, never a pass for a result that is all zeros against a real signal;
- SNR in dB, 10*log10(sum(ref^2) / sum((ref - got)^2)), clamped to +-SNR_CAP_DB (an exact match is
  +cap, noise against a zero reference is -cap);
- max and mean absolute error; argmax agreement for classifier-shaped outputs ([N, classes]).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ctxbuild.errors import ActionError, cause_line
from ctxbuild.figures import under
from ctxbuild.qnn import quantized_io
from ctxbuild.toolchain import installed as toolchain

if TYPE_CHECKING:  # imported where used: the cache-hit path needs no numpy
    import numpy as np

SNR_CAP_DB = 120.0

_ZERO_POWER = 1e-20

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

SPLIT_HINT = "its size depends on the input data, which QNN's fixed shapes cannot follow: split the model"
# When the model has none of the data-dependent ops graph/cut.py knows, the field is all the hint can name.
_SPLIT_BY_HAND = ("build the static part alone with `outputs: [...]` in the recipe (the tensors the data-dependent "
                  "nodes read), and run the rest in the app")


def split_hint(model: Path | None, samples: list[dict[str, np.ndarray]] | None = None) -> str:
    """SPLIT_HINT with the recipe line that builds `model`'s static part and the nodes it leaves to the app, as
    the model names them (graph/cut.py): its data-dependent ops and (given `samples` whose outputs differ in
    size) the nodes where the sizes start to differ, which may come before them (a TTS voice's durations: a Range
    up to their sum, long before its iSTFT's NonZero)."""
    from ctxbuild.graph.cut import DATA_DEPENDENT_OPS, split_line
    from ctxbuild.graph.modelio import load

    line = None
    if model is not None:
        proto = load(model, external_data=False)
        sources: set[int] = set()
        if samples:
            try:
                sources = _size_sources(model, proto, samples)
            except Exception:  # noqa: BLE001 - onnxruntime's untyped errors: the hint without the nodes, not another error
                sources = set()
        known = {i for i, n in enumerate(proto.graph.node) if n.op_type in DATA_DEPENDENT_OPS}
        line = split_line(proto, at=sources | known) if sources else split_line(proto)
    return f"{SPLIT_HINT}: {line or _SPLIT_BY_HAND}"


def _size_sources(model: Path, proto: Any, samples: list[dict[str, np.ndarray]]) -> set[int]:
    """graph/cut.size_sources over the model run on `samples` with every tensor as an output (the failure's path
    only: it holds every activation of a run)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    from ctxbuild.graph.cut import every_tensor, size_sources
    from ctxbuild.qnn.staging import link_data

    with tempfile.TemporaryDirectory() as d:
        link_data(model, Path(d))  # its external data, under the names the model uses
        path = Path(d) / model.name
        onnx.save(every_tensor(proto), str(path))
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        runs = [{n: r.shape for n, r in zip(names, sess.run(None, s))} for s in samples]
    return size_sources(proto, runs)


def compare(reference: dict[str, np.ndarray], got: dict[str, np.ndarray], model: Path | None = None
            ) -> dict[str, dict[str, float | None]]:
    """metrics() per output, after checking the compiled model's output has the float model's size. `model`: the
    user's model, whose static part the hint names when the sizes differ."""
    for name, ref in reference.items():
        if got[name].size != ref.size:
            raise ActionError(f"output '{name}': the output shape {list(got[name].shape)} differs from the float "
                              f"model's {list(ref.shape)}", split_hint(model))
    return {name: metrics(reference[name], got[name]) for name in reference}


def failures(result: dict[str, Any]) -> list[str]:
    t = result["thresholds"]
    out = []
    for name, m in result["outputs"].items():
        if not (m["cosine"] >= t["min_cosine"] and m["snr_db"] >= t["min_snr_db"]):  # NaN fails too
            out.append(f"output '{name}' cosine {under(m['cosine'], t['min_cosine'])} (min {t['min_cosine']}), "
                       f"SNR {m['snr_db']:.1f} dB (min {t['min_snr_db']})")
        for sl in m.get("slices") or []:
            if not (sl["cosine"] >= t["min_cosine"] and sl["snr_db"] >= t["min_snr_db"]):
                out.append(f"output '{name}' slice {sl['start']}:{sl['stop']} ({sl['slice']}, values up to "
                           f"{sl['range']:.3g}) cosine {sl['cosine']:.4f}, SNR {sl['snr_db']:.1f} dB")
    if result.get("bundle_signature_match") is False:
        out.append("the bundle's graph has different inputs/outputs than its single-graph build")
    return out

def cpu_outputs(model: Path, samples: list[dict[str, np.ndarray]], *, qdq_as_written: bool = False
                ) -> dict[str, np.ndarray]:
    """The model's outputs on the CPU EP over `samples`, concatenated per output. `qdq_as_written`: QDQ node
    groups run as written (quantize, dequantize, float op) instead of fused into onnxruntime's integer kernels,
    whose requantization rounds int8 and uint8 differently (one step apart on a PP-OCR classifier)."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3  # a LoRA reference's slots are overridable initializers: ORT warns per session
    if qdq_as_written:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(None, s) for s in samples]
    for i, n in enumerate(names):
        shapes = sorted({r[i].shape for r in runs})
        if len(shapes) > 1:
            raise ActionError(f"output '{n}' of the float model changes shape with the input ("
                              f"{', '.join(str(list(s)) for s in shapes[:3])} over {len(runs)} samples)",
                              split_hint(model, samples))
    return {n: np.concatenate([np.atleast_1d(r[i]) for r in runs]) for i, n in enumerate(names)}  # as simulate()

def simulate(ctx_model: Path, samples: list[dict[str, np.ndarray]], *, cpu_fallback: bool,
             timeout: float, timing: dict[str, float] | None = None,
             adapter: Path | None = None, stop: Callable[[list[dict[str, np.ndarray]]], bool] | None = None,
             workers: int = 1) -> dict[str, np.ndarray]:
    """Run on the simulator in a child process (one session for all samples); its crash or hang becomes an
    ActionError here. `timing` receives the child's session load and run seconds. `adapter`: an
    `.onnx_adapter` bound to every run (RunOptions.add_active_adapter). The child sends each sample's outputs
    as it finishes; `stop(outputs so far)` returning True ends the run there (early_stop.py): the result then
    holds the samples run so far. `workers` > 1 (sample_workers.py; not with `stop`, which needs the samples
    in order): that many children, one session each, over consecutive slices of the samples, joined in
    sample order. One sample is one simulator run whatever session runs it: the outputs are the same bytes."""
    import numpy as np

    k = max(1, min(workers if stop is None else 1, len(samples)))
    chunks = [samples[i * len(samples) // k:(i + 1) * len(samples) // k] for i in range(k)]
    parts: list[list[dict[str, np.ndarray]]] = [[] for _ in chunks]

    def on_sample(i: int, outputs: dict[str, np.ndarray]) -> bool:
        parts[i].append(outputs)
        return stop is not None and len(parts[0]) < len(samples) and stop(parts[0])

    done = in_children(_simulate_child, [(ctx_model, c, cpu_fallback) for c in chunks], timeout, adapter,
                       on_sample=on_sample)
    for result, exitcode, hung in done:
        if hung:
            raise ActionError(f"{ctx_model.name}: the HTP simulator did not finish within {timeout:g} s",
                              "raise verify.timeout_s, or verify fewer samples")
        if result is None:
            raise ActionError(f"{ctx_model.name}: the HTP simulator crashed (exit {exitcode}) running the "
                              "context binary", "the binary may be corrupt; rebuild it (see the log)")
        if isinstance(result, str):
            raise ActionError(f"{ctx_model.name}: the HTP simulator failed: {result}")
    if timing is not None:  # the children ran side by side: the slowest one is the wait
        timing.update({key: max(r[1].get(key, 0.0) for r, _, _ in done) for key in done[0][0][1]})
    runs = [r for part in parts for r in part]  # a scalar output (a probed one too) joins as one value per sample
    return {n: np.concatenate([np.atleast_1d(r[n]) for r in runs]) for n in runs[0]}


def in_child(target: Any, args: tuple[Any, ...], timeout: float, *more: Any,
             on_sample: Callable[[Any], bool] | None = None) -> tuple[Any, int | None, bool]:
    """target(*args, send, *more) in a forked child (the parent already imported onnxruntime: fork is cheap) that
    sends one result through `send`, optionally after ("sample", x) messages, each handed to `on_sample` (True:
    stop the child there; the result is then ("stopped", {"run": 0.0})). Returns (the result or None if it died,
    its exit code, whether it hung past `timeout` and was killed). Simulator runs go through it: a crash or hang
    there must not take the action."""
    return in_children(target, [args], timeout, *more,
                       on_sample=None if on_sample is None else lambda _i, x: on_sample(x))[0]


def in_children(target: Any, arglists: list[tuple[Any, ...]], timeout: float, *more: Any,
                on_sample: Callable[[int, Any], bool] | None = None) -> list[tuple[Any, int | None, bool]]:
    """in_child() for several children running side by side, one per entry of `arglists`, under one deadline;
    on_sample(child index, x). Returns in_child's triple per child, in order."""
    import multiprocessing
    from multiprocessing.connection import wait

    mp = multiprocessing.get_context("fork")
    children, results, pending = [], [None] * len(arglists), {}
    for i, args in enumerate(arglists):
        recv, send = mp.Pipe(duplex=False)
        child = mp.Process(target=target, args=(*args, send, *more), daemon=True)
        child.start()
        send.close()
        children.append(child)
        pending[recv] = i
    deadline = time.monotonic() + timeout
    while pending:
        ready = wait(list(pending), max(deadline - time.monotonic(), 0))
        if not ready:
            break  # past the deadline: what has not answered hung
        for recv in ready:
            i = pending[recv]
            try:
                msg = recv.recv()
            except EOFError:
                del pending[recv]  # died without a result
                continue
            if isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "sample" and on_sample is not None:
                if on_sample(i, msg[1]):
                    results[i] = ("stopped", {"run": 0.0})
            else:
                results[i] = msg
            if results[i] is not None:
                del pending[recv]
    out = []
    for child, result in zip(children, results):
        child.join(5 if result is not None else 0)
        hung = child.is_alive()
        if hung:
            child.kill()
            child.join()
        out.append((result, child.exitcode, hung and result is None))
    return out


def _simulate_child(ctx_model: Path, samples: list[dict[str, np.ndarray]], cpu_fallback: bool, send: Any,
                    adapter: Path | None = None) -> None:
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
        for s in samples:
            got = dict(zip(names, sess.run(None, s, ro)))
            send.send(("sample", {n: quantized_io.dequantize(v, enc[n]) if n in enc else v for n, v in got.items()}))
        send.send(("done", {"load": loaded - start, "run": time.monotonic() - loaded}))
    except Exception as e:  # noqa: BLE001 - report ORT's message to the parent as one line
        send.send(cause_line(e, last=True))
