"""Verification outputs memoized in the build cache, keyed by content digests.

A verify action re-runs whenever any of its parameters change (thresholds, the method label, a bundle beside
it), but the expensive parts depend on far less: the simulator's outputs on the context binary's bytes and the
samples, the CPU reference's on the float model and the samples. Both are stored as an .npz blob under a key
of exactly those digests plus the toolchain, through the same cache (local, remote, digest-checked) as action
outputs. A byte-identical binary verified once (another target of a search, a multi-SoC twin, a threshold
change, another OUT) costs a cache restore instead of a simulator run. The comparison itself always runs.
`CTXBUILD_VERIFY_MEMO=0` turns it off (bench/verify_cost.py measures with and without).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable


from ctxbuild import settings
from ctxbuild.digests import canonical_json
from ctxbuild.errors import ActionError, cause_line

if TYPE_CHECKING:  # imported where used: a verify cache hit needs no numpy
    import numpy as np

Outputs = dict[str, "np.ndarray"]
# The reference runs a QDQ model's groups as written (the math the HTP computes, and the float model's to 1e-7 on
# PP-OCR), not fused into onnxruntime's integer kernels (cosine 0.96 against it there); in the memo keys.
AS_WRITTEN = "qdq as written"


def wrapper_identity(ctx_model: Path) -> str:
    """Digest of an EPContext wrapper without the file name of its external binary: wrappers of byte-identical
    binaries built under different recipe names differ only there (measured), and run identically."""
    import onnx

    model = onnx.load(str(ctx_model), load_external_data=False)
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        external = "embed_mode" in attrs and attrs["embed_mode"].i == 0
        if node.op_type == "EPContext" and external and "ep_cache_context" in attrs:
            attrs["ep_cache_context"].s = b""  # the .bin's name; its bytes are keyed by their own digest
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


class OutputsMemo:
    def __init__(self, cache: Any, tmp: Path) -> None:
        self.cache = cache if settings.VERIFY_MEMO.get() else None
        self.tmp = tmp
        self.hits: list[str] = []
        self.keys: dict[str, str] = {}  # what -> cache key (in the record: the entries this action uses)

    def get_or_compute(self, what: str, parts: Any, compute: Callable[[], Outputs],
                       complete: Callable[[], bool] = lambda: True) -> Outputs:
        """`what` names the computation (and is reported in `hits`); `parts` is everything it depends on.
        `complete()` False after computing: partial outputs (a stopped run), neither stored nor listed."""
        import numpy as np

        if self.cache is None:
            return compute()
        key = hashlib.sha256(canonical_json(["verify-memo", what, parts])).hexdigest()
        self.keys[what] = key
        path = self.tmp / f"memo-{what}-{key[:16]}.npz"
        hit = self.cache.lookup(key)
        if hit is not None and self.cache.restore(hit, {"outputs": path}):
            try:
                with np.load(path, allow_pickle=False) as z:  # tensor names may hold '/': stored by index
                    got = {str(n): z[str(i)] for i, n in enumerate(z["names"])}
                self.hits.append(what)
                return got
            except (OSError, ValueError):
                pass  # unreadable despite its digest (format change): compute and overwrite
        got = compute()
        if not complete():
            del self.keys[what]
            return got
        path.unlink(missing_ok=True)  # a restore may have left a hard link into the cache there: never write through it
        np.savez(path, names=np.array(list(got)), **{str(i): v for i, v in enumerate(got.values())})
        self.cache.store(key, {"outputs": path}, None, {"id": f"verify-memo/{what}"})
        return got


def float_reference(ctx: Any, samples: list[dict[str, np.ndarray]], memo: OutputsMemo) -> tuple[Outputs, list[Any]]:
    """The user's model's outputs on `samples`, as the user gave it (memoized: a verify and a screen of the same
    graph share them), and the samples' identity for other memo keys. The action's params hold `samples`,
    `sample_source`, `inputs`. Only when onnxruntime's CPU EP cannot run the original as given (an IR version newer
    than it reads, an op it refuses) is the prepared model the reference; `ctx.facts["reference"]` says which and
    why, and the verify result carries it."""
    from ctxbuild.verify.measure import cpu_outputs

    a, key = ctx.action, ctx.key_components
    p, inputs = a.params, key["inputs"]
    sample_id = [p["sample_source"], p["samples"], p["inputs"], key["discovered_inputs"],
                 inputs["reference"] if p["sample_source"] == "random" else None]
    data = {k: v for k, v in key["discovered_inputs"].items() if k.startswith("original.")}
    # `outputs:`: those tensors of the user's model; `input_values:`: run with those inputs set (each in the key
    # only when given: others keep theirs)
    cut, values = p.get("outputs"), p.get("input_values")
    extra = [*([cut] if cut else []), *([{"input_values": values}] if values else [])]

    def original() -> Outputs:
        model = Path(a.inputs["original"])
        if cut:
            return cpu_outputs(_cut_original(model, cut, values, ctx.tmp), samples, qdq_as_written=True)
        if values:  # the user's model as given, the inputs set as the app sets them
            from ctxbuild.graph.inputvalues import as_arrays
            from ctxbuild.graph.modelio import load

            fixed = as_arrays(load(model, external_data=False), values)
            return cpu_outputs(model, [s | fixed for s in samples], qdq_as_written=True)
        return cpu_outputs(model, samples, qdq_as_written=True)

    try:
        reference = memo.get_or_compute("original", [inputs["original"], data, sample_id,
                                                     key["toolchain"]["onnxruntime"], AS_WRITTEN, *extra], original)
        ctx.facts["reference"] = "original"
        return reference, sample_id
    except (ActionError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime's exceptions are untyped
        why = cause_line(e)
        ctx.facts["reference"] = f"prepared model (onnxruntime's CPU EP cannot run the original as given: {why})"
    reference = memo.get_or_compute("reference", [inputs["reference"], inputs.get("reference.data"), sample_id,
                                                   key["toolchain"]["onnxruntime"], AS_WRITTEN],
                                    lambda: cpu_outputs(Path(a.inputs["reference"]), samples, qdq_as_written=True))
    return reference, sample_id


def _cut_original(original: Path, outputs: list[str], values: dict[str, Any] | None, tmp: Path) -> Path:
    """The user's model as given, cut to the part computing `outputs` (graph/cut.py), written under `tmp` beside
    links to its external data: the reference for a build of that part. With `values` (`input_values:`), the
    inputs are those constants and the Ifs they decide inlined first (exact: the branch the model would take),
    as the tensors to cut at may be inside them."""
    from ctxbuild.graph.cut import extract
    from ctxbuild.graph.inputvalues import apply
    from ctxbuild.graph.modelio import load
    from ctxbuild.qnn.staging import link_data
    import onnx

    d = tmp / "original-cut"
    d.mkdir(exist_ok=True)
    link_data(original, d)
    path = d / original.name
    model = load(original, external_data=False)
    if values:
        apply(model, values)
    onnx.save(extract(model, outputs), str(path))
    return path
