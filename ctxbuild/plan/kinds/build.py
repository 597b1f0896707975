"""The kinds every recipe's graph goes through: prepare, quantize, compile (or a prebuilt binary), verify."""
from __future__ import annotations

from typing import Any, TypedDict

from ctxbuild.plan.kinds.base import Kind, MemoryModel, Shape


class _PrepareRequired(TypedDict):
    inputs: Shape
    optimize: bool  # ORT basic optimizer (off for qdq: it would fold weight DequantizeLinear away)


class PrepareParams(_PrepareRequired, total=False):
    adapter_slots: dict[str, Any]  # LoRA: slot patterns and scaling input; slots become optional inputs
    alpha: dict[str, Any]  # switch: alpha: input name, targets, adapters (name, format, tensors, scale)
    rewrite: bool | list[str]  # prepare.rewrite: False or the legalization rules to apply (absent: all)
    check: dict[str, Any]  # what the rewrites are checked on: samples (how many), sample_source (as verify's)
    legalize_code: str  # digest of the rules' source (plan/steps.py): a rule added or changed re-prepares
    outputs: list[str]  # `outputs:`: the model cut to the part computing these tensors (graph/cut.py)
    input_values: dict[str, Any]  # `input_values:`: those inputs made constants (graph/inputvalues.py)


class Prepare(Kind):
    """Fix input shapes, stamp an IR version onnxruntime reads, reject control flow, fold, legalize, check."""
    name = "prepare"
    implementation = "ctxbuild.actions.prepare"
    params = PrepareParams
    discovers_inputs = True  # external data files, and the samples the rewrites are checked on (watch)
    discovery_follows = "model"
    legalizes = True
    # ORT's optimizer holds the weights about once (1.08x); without it (qdq) external tensors are copied range by range
    memory = MemoryModel(1.3, ("model",), user_model=True, unoptimized_factor=0.1)


class _QuantizeRequired(TypedDict):
    quantization: dict[str, Any]  # quantization.py's settings for onnxruntime's QNN quantizer
    samples: int
    random: bool
    inputs: Shape


class QuantizeParams(_QuantizeRequired, total=False):
    adapters: dict[str, Any]  # LoRA: the calibration set (adapter name -> tensors, scale, scaling)
    alpha: int  # switch: alpha: how many adapters (calibrated over all zeros and each one-hot)


class Quantize(Kind):
    """QDQ quantization for QNN on the recipe's calibration samples."""
    name = "quantize"
    implementation = "ctxbuild.actions.quantize"
    params = QuantizeParams
    discovers_inputs = True  # calibration samples
    memory = MemoryModel(3.5, ("model",))  # the quantizer and its calibration session (3.0x, float32 weights)


class _CompileRequired(TypedDict):
    provider_options: dict[str, str]
    embed: bool
    cpu_fallback: bool
    precision: str
    graphs: list[str]


class CompileParams(_CompileRequired, total=False):
    split_outputs: bool | list[str]  # only when the recipe sets it (existing keys stay as they were)
    quantized_io: bool  # likewise: the wrapper's I/O takes the quantized types (quantized_io.py)
    fp16_rewrite: dict[str, Any]  # fp16: legalize's FP16_RULES applied first ({rules, code}: their sources' digest)


class Compile(Kind):
    """One graph for one target (or one multi-SoC binary) with the QNN EP's ModelCompiler."""
    name = "compile"
    implementation = "ctxbuild.actions.compile"
    params = CompileParams
    uses_qnn = True
    deliverable = True
    # the HTP compiler holds ~3.9x the bytes that end in the binary; fp16 models carry float32 weights (~2x); an
    # LLM's w4a16 graph (int4 weights, 16-bit activations) 5.2x: 2.00 GiB for a 3B part graph's 0.33 GiB of QDQ
    memory = MemoryModel(4.2, ("model",), {"fp16": 2.2, "w4a16": 5.5})


class PrebuiltParams(TypedDict):
    graphs: list[str]
    embed: bool
    quantized_io: bool
    soc_model: str
    htp_arch: str


class Prebuilt(Kind):
    """A context binary made elsewhere, checked with libQnnSystem and wrapped per target."""
    name = "prebuilt"
    implementation = "ctxbuild.actions.prebuilt"
    params = PrebuiltParams
    uses_qnn = True
    deliverable = True
    verified_here = False
    memory = MemoryModel(2.0, ("bin",))


class _VerifyRequired(TypedDict):
    graph: str
    method: str
    precision: str
    thresholds: dict[str, float]
    samples: int
    timeout_s: float
    sample_source: str
    cpu_fallback: bool
    inputs: Shape


class VerifyParams(_VerifyRequired, total=False):
    split_outputs: bool | list[str]  # the wrapper's re-joining Concat runs on the CPU
    slices: dict[str, Any]  # recipe-declared output slices
    gate: bool  # False: a precision-search candidate, measured here and judged by `select`
    early_stop: dict[str, float]  # a search candidate: stop once its samples prove it misses these
    outputs: list[str]  # `outputs:`: the user's model cut at these tensors is the reference
    input_values: dict[str, Any]  # `input_values:`: the user's model run with those inputs set is the reference


class Verify(Kind):
    """A compiled graph on the HTP simulator against the float model on the CPU EP."""
    name = "verify"
    implementation = "ctxbuild.actions.verify"
    params = VerifyParams
    discovery_follows = "original"  # its external data; and the samples (watch)
    discovers_inputs = True  # verification samples
    uses_qnn = True
    verification = True
    verdict = True
    per_layer = True
    # the float model on the CPU EP plus the simulator: 0.6x for fp16/int8, 2.4x for qdq
    memory = MemoryModel(3.0, ("reference", "ctx.bin"), {"fp16": 1.2, "w8a8": 1.2, "w8a16": 1.2, "w16a16": 1.2})
