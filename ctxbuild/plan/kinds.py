"""Action kinds: the one place that says what each kind of action is and what it needs.

One class per kind, registered by subclassing `Kind` (as Olive registers its passes): its name, the
module that implements it (imported only by the process that runs the action, so the driver, the
planner and the report never pay for numpy or onnxruntime), the TypedDict of its parameters, and flags
that the rest of ctxbuild reads instead of keeping lists of kind names:

- `discovers_inputs`: it reads files found at run time (external data, calibration samples): its
  implementation's `discover_inputs` hook names them, they join the action key, and ninja watches them
  through a depfile (ninja.py, runner.py);
- `uses_qnn`: its outputs depend on the QNN compiler/simulator: onnxruntime-qnn and the QNN SDK build id
  join its key (plan/actionkey.py);
- `deliverable`: its outputs under OUT/<target>/ are artifacts (manifest, report rows); its outputs in
  the work dir are verification twins (plan.Plan.artifacts, report.py);
- `discovery_follows`: the input role (a model file) whose bytes and place, with the action's params and the
  listing of its watched directories, decide what it discovers (external data beside the model, samples):
  prerestore.py memoizes the discovery by those instead of parsing the model;
- `verification`: it checks accuracy (`ctxbuild verify` runs these edges; the report shows them per row);
  a deliverable that is also a verification (select) verified what it delivers itself;
- `verdict`: its result is the manifest's verdict on the deliverables it reads (their `verified_by`);
- `multi_graph`: a deliverable holding several graphs in one binary; the manifest lists the single-graph twins
  its verifications ran on (they measure the weight-sharing savings too);
- `picks_candidate`: it chooses among a search's candidates (the plan state lists each candidate's actions);
- `verified_here`: False for deliverables ctxbuild did not build (prebuilt binaries): no verification note;
- `memory`: its measured peak-memory model (memory.py schedules and checks actions by it).

Adding a kind: a class here and its implementation module (see docs/internals.md, "Adding an action kind").
"""
from __future__ import annotations

import importlib
from types import ModuleType
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypedDict


@dataclass(frozen=True)
class MemoryModel:
    """Peak RSS of one action process = memory.BASE + factor x the bytes of the inputs it reads whole.
    Fitted on MatMul chains of 0.1-1 GB (bench/memory_bench.py, docs/large-models.md), rounded up."""
    factor: float = 0.0
    weight_roles: tuple[str, ...] = ()  # input role prefixes read whole (specs, wrappers, samples are small)
    by_precision: dict[str, float] = field(default_factory=dict)
    user_model: bool = False  # `model` is the user's file: its external data counts (ctxbuild's models list theirs)
    per_context_length: bool = False  # an llm action holding one CL's graphs at a time: weights count per CL
    per_sequence_length: bool = False  # ... and one AR's at a time, once per AR (llm/ar_sessions.py; params["graphs"])
    own_graph_factor: float = 0.0  # a later phase holding one of the action's own graphs (params["graphs"]) this
    # many times over (onnxruntime's quantizer); the estimate is the larger phase
    activations_per_position: int = 0  # bytes the factor's phase holds beyond its weights per position of the
    # largest of params["context_lengths"]: an LLM's sessions' activations (attention scores, KV inputs, dequantized
    # weights), which grow with the context and which the weights do not measure
    unoptimized_factor: float | None = None  # with params["optimize"] false: the factor instead of `factor`
    files_once: bool = False  # sessions map the weight files, sharing pages: a file inputs share counts once


class Kind:
    name: ClassVar[str]
    implementation: ClassVar[str]  # module with run(ctx) and optional hooks (ctxbuild/actions/__init__.py)
    params: ClassVar[type]  # a TypedDict: the keys every action of this kind carries in `params`
    discovers_inputs: ClassVar[bool] = False
    discovery_follows: ClassVar[str | None] = None
    uses_qnn: ClassVar[bool] = False
    deliverable: ClassVar[bool] = False
    verification: ClassVar[bool] = False
    verdict: ClassVar[bool] = False
    multi_graph: ClassVar[bool] = False
    picks_candidate: ClassVar[bool] = False
    verified_here: ClassVar[bool] = True
    memory: ClassVar[MemoryModel] = MemoryModel()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name in _REGISTRY:
            raise TypeError(f"action kind {cls.name!r} is registered twice ({_REGISTRY[cls.name].__name__}, "
                            f"{cls.__name__})")
        _REGISTRY[cls.name] = cls

    @classmethod
    def module(cls) -> ModuleType:
        return importlib.import_module(cls.implementation)

    @classmethod
    def hook(cls, name: str) -> Callable[..., Any]:
        """The implementation's `name` hook, or the default that does nothing."""
        return getattr(cls.module(), name, HOOK_DEFAULTS[name])


_REGISTRY: dict[str, type[Kind]] = {}
HOOK_DEFAULTS: dict[str, Callable[..., Any]] = {
    "discover_inputs": lambda action: {}, "warnings": lambda action: [], "summarize": lambda action: {},
    "key_extras": lambda action: {}, "check_outputs": lambda action, outputs: None}


def get(name: str) -> type[Kind]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown action kind {name!r} (known: {', '.join(_REGISTRY)})") from None


def all_kinds() -> list[type[Kind]]:
    return list(_REGISTRY.values())


def names(**flags: bool) -> set[str]:
    """Kinds whose flags have the given values, e.g. names(deliverable=True)."""
    return {k.name for k in _REGISTRY.values() if all(getattr(k, f) == v for f, v in flags.items())}


# --- the kinds --------------------------------------------------------------------------------------------

Shape = dict[str, list[int]]  # input name -> fixed dims


class _PrepareRequired(TypedDict):
    inputs: Shape
    optimize: bool  # ORT basic optimizer (off for qdq: it would fold weight DequantizeLinear away)


class PrepareParams(_PrepareRequired, total=False):
    adapter_slots: dict[str, Any]  # LoRA: slot patterns and scaling input; slots become optional inputs
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
    # ORT's optimizer holds the weights about once (1.08x); without it (qdq) external tensors are copied range by range
    memory = MemoryModel(1.3, ("model",), user_model=True, unoptimized_factor=0.1)


class _QuantizeRequired(TypedDict):
    quantization: dict[str, Any]  # quantization.py's settings for onnxruntime's QNN quantizer
    samples: int
    random: bool
    inputs: Shape


class QuantizeParams(_QuantizeRequired, total=False):
    adapters: dict[str, Any]  # LoRA: the calibration set (adapter name -> tensors, scale, scaling)


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


class _BundleRequired(TypedDict):
    provider_options: dict[str, str]
    cpu_fallback: bool
    precision: str
    graphs: list[str]


class BundleParams(_BundleRequired, total=False):
    adapters: bool  # LoRA: the wrappers get the slots' defaults from the float references


class Bundle(Kind):
    """Several graphs in one weight-shared context binary."""
    name = "bundle"
    implementation = "ctxbuild.actions.bundle"
    params = BundleParams
    uses_qnn = True
    deliverable = True
    multi_graph = True
    # as compile, over all its graphs (2.03x two fp16); an LLM part's w4a16 graphs (one weight file, counted per
    # graph) 4.2-4.5x: at the 1B shape 2.29 GiB for 4 x 122 MB (4 layers), 6.21 GiB for 4 x 415 MB (the embedding
    # or head), the 3B shape's 5.84 GiB for 4 x 355 MB, the 1B shape at 2 parts 8.32 GiB for 4 x 537 MB (docs/llm.md)
    memory = MemoryModel(4.2, ("model:",), {"fp16": 2.2, "w4a16": 4.8})


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
    # the float model on the CPU EP plus the simulator: 0.6x for fp16/int8, 2.4x for qdq
    memory = MemoryModel(3.0, ("reference", "ctx.bin"), {"fp16": 1.2, "int8": 1.2, "int16": 1.2})


class _ScreenRequired(TypedDict):
    samples: int
    sample_source: str
    inputs: Shape


class ScreenParams(_ScreenRequired, total=False):
    slices: dict[str, Any]  # recipe-declared output slices, measured as verify does
    outputs: list[str]  # `outputs:`: the user's model cut at these tensors is the reference
    input_values: dict[str, Any]  # `input_values:`: the user's model run with those inputs set is the reference


class Screen(Kind):
    """precision: auto: a candidate's QDQ model on the CPU EP against the float model (rejects before compiling)."""
    name = "screen"
    implementation = "ctxbuild.actions.screen"
    params = ScreenParams
    discovery_follows = "original"  # its external data; and the samples (watch)
    discovers_inputs = True  # verification samples
    memory = MemoryModel(3.0, ("reference", "model"))


class SearchStepParams(TypedDict):
    mode: str  # "need" (any target, gates quantize and screen) | "admit" (one target, gates compile and verify)
    candidate: str
    ladders: dict[str, list[str]]  # target -> its candidates in ladder order
    thresholds: dict[str, float]
    predict: dict[str, Any]  # the skipping rules' parameters (verify/predict.rules)
    siblings: dict[str, list[str]]  # target -> the earlier targets whose failures it skips


class SearchStep(Kind):
    """precision: auto: whether a candidate is still needed, from the results of the ones before it."""
    name = "search_step"
    implementation = "ctxbuild.actions.search_step"
    params = SearchStepParams


class CulpritsParams(ScreenParams):  # the verification samples, as a screen's
    candidate: str  # the mixed rung's name
    bases: list[str]  # the quantization candidates before it, ladder order
    settings: dict[str, dict[str, Any]]  # base -> its quantization settings
    ladders: dict[str, list[str]]  # target -> its candidates up to the mixed rung
    thresholds: dict[str, float]
    predict: dict[str, Any]  # the skipping rules' parameters (verify/predict.rules), as the gates'
    provider_options: dict[str, dict[str, str]]  # target -> its compile's (the diagnosis's debug builds)
    no_int16_weights: list[str]  # targets whose arch cannot run 16-bit weights
    diagnose_samples: int
    timeout_s: float
    calibration: dict[str, Any]  # samples, random, dir (watched last): what the growing rounds quantize with


class CulpritsParamsOpt(CulpritsParams, total=False):
    slices: dict[str, Any]


class Culprits(Kind):
    """precision: auto: the mixed-precision candidate's settings, from the per-node diagnosis of a failed one."""
    name = "culprits"
    implementation = "ctxbuild.actions.culprits"
    params = CulpritsParamsOpt
    discovery_follows = "original"  # its external data; and the samples (watch)
    discovers_inputs = True  # verification samples
    uses_qnn = True  # the diagnosis compiles and simulates debug builds
    memory = MemoryModel(3.0, ("reference", "model."))


class SelectParams(TypedDict):
    thresholds: dict[str, float]
    predict: dict[str, Any]  # the skipping rules' parameters (verify/predict.rules)
    candidates: list[dict[str, Any]]  # ladder order: name, quantization (or precision: fp16 for the last rung), action ids
    skipped: list[dict[str, str]]
    graphs: list[str]
    precision: str
    siblings: list[str]  # the earlier targets whose failures this one skips (their verifies: sibling.<target>.<name>)


class Select(Kind):
    """precision: auto: the first candidate (ladder order) whose verification meets the thresholds."""
    name = "select"
    implementation = "ctxbuild.actions.select"
    params = SelectParams
    deliverable = True
    verification = True  # it judges the candidates' verifications: `ctxbuild verify` runs it
    picks_candidate = True


class AdapterParams(TypedDict):
    name: str
    graph: str
    format: str  # the file's suffix: it picks the reader, so it is keyed
    tensors: dict[str, str]  # slot -> tensor name in the adapter file
    scale: float | None
    scaling: str | None  # the model's scaling input, if any


class Adapter(Kind):
    """One LoRA adapter bound for one graph and target: its .onnx_adapter, checked against the wrapper's slots."""
    name = "adapter"
    implementation = "ctxbuild.actions.adapter"
    params = AdapterParams


class VerifyAdapterParams(VerifyParams, total=False):
    adapter: str
    calibrated: bool  # in the calibration set: a clipping failure then means the base's encodings are wrong
    bind: dict[str, Any]  # compile.quantized_io: how the adapter action bound the file (the reference rebinds it)


class VerifyAdapter(Kind):
    """A graph's verification with one adapter bound (RunOptions.add_active_adapter) on the simulator."""
    name = "verify_adapter"
    implementation = "ctxbuild.actions.verify_adapter"
    params = VerifyAdapterParams
    discovery_follows = "original"  # its external data; and the samples (watch)
    discovers_inputs = True
    uses_qnn = True
    verification = True
    memory = Verify.memory


class LoraSectionsParams(TypedDict):
    names: list[str]
    sdk_mismatch: str  # "error" | "warn"
    soc_model: str
    htp_arch: str


class LoraSections(Kind):
    """LoRAv2 sections made elsewhere: copied beside a prebuilt wrapper, one qnn.lora_config each."""
    name = "lora_sections"
    implementation = "ctxbuild.actions.lora_sections"
    params = LoraSectionsParams
    uses_qnn = True  # the base binary's SDK build is compared with the installed EP's


# --- LLMs (ctxbuild/llm/): the decoder's static graphs, quantized per part; bundle and compile do the rest ---

class _LlmSplitRequired(TypedDict):
    parts: int
    sequence_lengths: list[int]
    context_lengths: list[int]
    graphs: list[str]
    check: dict[str, int]  # prompts and tokens the greedy check of the static graphs decodes; original_tokens:
    # the original's greedy tokens kept in layout.json for llm_genai


class LlmSplitParams(_LlmSplitRequired, total=False):
    adapter_slots: dict[str, Any]  # llm.adapters: slot patterns and scaling; slots become inputs with defaults


class LlmSplit(Kind):
    """A dynamic decoder -> static graphs per (part, AR, CL), checked: chained on the CPU they decode the
    original model's greedy tokens."""
    name = "llm_split"
    implementation = "ctxbuild.actions.llm_split"
    params = LlmSplitParams
    discovers_inputs = True  # the model's external data and the prompt files
    # the original's session, then one CL's graphs of one AR at a time (llm/ar_sessions.py), which hold the model
    # and the tied head's copy: 13.6 GiB for the 3B shape's 12.0 GiB (1.14x), 1.3 GiB for a 0.65 GiB 2-layer
    # decoder whose head is a third of it; the 1B shape (4.6 GiB) 6.98 GiB at 2 parts, 8.07 at 4, where the records
    # kept for the part checks held closed sessions' arenas (before pipeline.cpu_runner copied its outputs); with
    # the activations of the static sessions at the largest CL: 1.39 GiB for a 0.62 GB decoder (hidden 1024, 4 parts,
    # CL 2048; 2.25 GiB before the fix) (bench/llm_bench.py, docs/llm.md)
    memory = MemoryModel(1.6, ("model",), user_model=True, activations_per_position=256 << 10)


class _LlmQuantizeRequired(TypedDict):
    part: int
    graphs: list[str]
    precision: str
    kv_cache: str
    keep_8bit: list[str]  # w4a16: fnmatch patterns of weights kept at int8
    samples: int  # calibration prompts
    tokens: int  # greedy tokens decoded per prompt while recording calibration inputs
    context_lengths: list[int]


class LlmQuantizeParams(_LlmQuantizeRequired, total=False):
    adapters: dict[str, Any]  # llm.adapters: the calibration set (adapter name -> tensors, scale, scaling)


class LlmQuantize(Kind):
    """One part's graphs to QDQ (int4/int8 per-channel weights, uint16 activations), calibrated on the
    hidden states and KV caches the float pipeline produces for the recipe's prompts."""
    name = "llm_quantize"
    implementation = "ctxbuild.actions.llm_quantize"
    params = LlmQuantizeParams
    discovers_inputs = True  # the prompt files
    # calibration: one CL's float sessions of one AR (every part's graphs), reopened at each AR switch, keeping the
    # part's recorded calls compactly; then onnxruntime's quantizer on one graph at a time (model, augmented copy,
    # calibration session, QDQ output) on top of what calibration left. At the 1B shape, 4 parts (6.0 GB of float
    # parts; /proc traced, docs/llm.md): calibration 5.9 GiB with nothing recorded yet (1.0x; the 3B shape's 14.1 GiB
    # for 14.4 GB); the quantizer phase 5.1 / 5.9 GiB above its floor on a 2.0 GB graph (2.7x; 3.1x with the tied
    # head). Its floor and the calibration peaks of parts 2-4 (9.3-9.5 GiB) were mostly the full-size recorded KV and the closed sessions' arenas their
    # recorded hidden states kept, both gone (pipeline.cpu_runner, calibration_feeds): the same build since, 7.42 /
    # 6.63 / 6.53 / 7.85 GiB for parts 1-4 (estimates 8.77 / 8.05 / 8.05 / 8.78). The 1B shape's 2-part quantizes
    # (12.8 / 15.7 GiB) and the 3B part (17.4 GiB, 2 prompts) held them too
    # (the part that is not weights, activations at AR 128 x CL 2048 of every part's session, shows on small
    # decoders: 1.39 GiB for 0.75 GB of float parts, hidden 1024, 4 parts; 2.53 GiB before the fix)
    memory = MemoryModel(1.3, ("model:",), per_context_length=True, per_sequence_length=True, own_graph_factor=4.5,
                         activations_per_position=256 << 10)


class _LlmEvalRequired(TypedDict):
    graphs: list[str]
    context_lengths: list[int]
    precision: str
    prompts: int
    generate: int
    thresholds: dict[str, float]
    timeout_s: float


class LlmEvalParams(_LlmEvalRequired, total=False):
    adapter: str  # llm.adapters: this adapter bound on every graph with slots (its .onnx_adapter files)
    calibrated: bool  # in the calibration set


class LlmEval(Kind):
    """Token-level verification: greedy decode through the float parts vs the QDQ parts (CPU EP) and the
    compiled single-graph twins (HTP simulator): top-1 agreement, logits cosine and SQNR, first divergence."""
    name = "llm_eval"
    implementation = "ctxbuild.actions.llm_eval"
    params = LlmEvalParams
    discovers_inputs = True  # the prompt files
    uses_qnn = True
    verification = True
    verdict = True
    memory = MemoryModel(2.0, ("reference:",), per_context_length=True)  # 1.6x measured (bench/llm_bench.py)


class LlmPartEvalParams(TypedDict):
    part: int
    parts: int
    graphs: list[str]  # the part's graphs
    context_lengths: list[int]
    precision: str
    provider_options: dict[str, str]  # the bundle's: the twins compiled inside are the same graphs, same options
    prompts: int
    thresholds: dict[str, float]
    timeout_s: float
    simulator: str  # llm.simulator: auto, all, covering


class LlmPartEval(Kind):
    """One part on the calls the float decode recorded (llm_split): its graphs compiled alone inside the action
    (not kept), run on the HTP simulator and the QDQ graphs on the CPU, each output against the float part's;
    the last part's logits also by top-1 agreement with the float tokens."""
    name = "llm_part_eval"
    implementation = "ctxbuild.actions.llm_part_eval"
    params = LlmPartEvalParams
    uses_qnn = True
    verification = True
    verdict = True
    # the covering twins compiled one at a time (as compile at w4a16: 5.5x its model, whose data is the part's weight
    # file; each in a child), then each CL's twins on the simulator (a child each: 0.3 GiB at the 1B shape), then one
    # CL's QDQ graphs on the CPU in the action itself, the peak: a session per AR, each holding the part's QDQ weights,
    # and their activations at the largest CL (attention, the dequantized LM head in the last part). Measured at the
    # 1B shape, 4 parts (docs/llm.md): 1.61 / 1.60 GiB for 122 MB of QDQ weights, 1.91 / 2.66 GiB for ~415 MB
    # (embedding / head), at CL 2048: 2.0x one CL's graphs' bytes + 512 KiB per position of the largest CL
    memory = MemoryModel(2.0, ("model:",), per_context_length=True, own_graph_factor=5.5,
                         activations_per_position=512 << 10)


class LlmPackageParams(TypedDict):
    recipe: str
    parts: int
    sequence_lengths: list[int]
    context_lengths: list[int]
    precision: str


class LlmPackage(Kind):
    """genai_config.json for onnxruntime-genai's decoder pipeline, naming the part wrappers compiled."""
    name = "llm_package"
    implementation = "ctxbuild.actions.llm_package"
    params = LlmPackageParams
    deliverable = True


class LlmGenaiParams(TypedDict):
    prompts: int  # verification prompts
    tokens: int  # greedy tokens compared per prompt (32, or llm.generate when the recipe sets it)
    wrappers: dict[str, str]  # the shipped config's part stage files (compiled wrappers) -> their graphs
    twin: str  # what cpu_twin/ runs in their place: "qdq" or "float" (fp16: what was compiled)


class LlmGenai(Kind):
    """The shipped genai_config.json run by onnxruntime-genai on its CPU twin (each compiled part's float static
    graph in place of its wrapper) against the original export's greedy tokens (llm_split's, in layout.json);
    cpu_twin/ written out."""
    name = "llm_genai"
    implementation = "ctxbuild.actions.llm_genai"
    params = LlmGenaiParams
    discovers_inputs = True  # the prompt files
    verification = True
    verdict = True  # a config decoding other tokens does not ship
    # genai's sessions over the largest CL's float graphs, every part and AR at once, reading each part's weight
    # file mapped in place (actions/llm_genai.py SHARED), then the same over the compiled graphs (smaller, or the
    # same files for fp16): the float files once each, plus genai's KV cache and activations. The original export
    # is not loaded (llm_split kept its tokens). At the 1B shape (4 parts, 6.0 GB of float files) 1.8 GiB of it
    # anonymous and 9.3 GiB the files' mapped pages, which RSS counts once per AR session mapping them (11.1 GiB):
    # in memory the files once, 7.4 GiB; 1.4x the files (docs/llm.md, Verification)
    memory = MemoryModel(1.4, ("float:",), files_once=True)


class LlmFloatEvalParams(TypedDict):
    text: str  # where the evaluation text comes from (the recipe's file, or ctxbuild's own), for the result
    segment: int  # tokens per perplexity segment: the largest context length
    max_segments: int  # llm.eval.segments
    tokens: int  # greedy tokens per prompt (llm.eval.tokens; fewer where the context length leaves less room)
    prompts: int  # verification prompts


class LlmFloatEval(Kind):
    """The float export's perplexity of the evaluation text and greedy continuation of each prompt (CPU EP): the
    reference of the quality gates, shared by every target and precision reading the same export and text."""
    name = "llm_float_eval"
    implementation = "ctxbuild.actions.llm_float_eval"
    params = LlmFloatEvalParams
    discovers_inputs = True  # the export's external data and the prompt files
    memory = MemoryModel(1.6, ("model",), user_model=True, activations_per_position=256 << 10)  # as llm_split's export


class LlmQualityCpuParams(TypedDict):
    context_length: int  # the graphs chained: the largest CL's


class LlmQualityCpu(Kind):
    """The QDQ parts chained on the CPU EP: perplexity, teacher-forced agreement and free-running greedy text
    against the float export's (once per recipe: every target reads it)."""
    name = "llm_quality_cpu"
    implementation = "ctxbuild.actions.llm_quality_cpu"
    params = LlmQualityCpuParams
    # one AR's sessions over every part's QDQ graphs at one CL (llm/ar_sessions.py), as llm_part_eval's CPU phase
    memory = MemoryModel(2.0, ("qdq:",), per_context_length=True, activations_per_position=512 << 10)


class LlmQualityParams(TypedDict):
    context_length: int
    precision: str
    thresholds: dict[str, float]  # max_ppl_ratio, min_agreement
    subset: dict[str, int]  # what the simulator runs: segments, prompts, tokens
    timeout_s: float


class LlmQuality(Kind):
    """The quality gates for one target: perplexity ratio and greedy agreement of the QDQ parts (CPU) and of the
    compiled parts' twins chained on the HTP simulator (a subset), against the float export; fails the build."""
    name = "llm_quality"
    implementation = "ctxbuild.actions.llm_quality"
    params = LlmQualityParams
    uses_qnn = True
    verification = True
    verdict = True
    memory = MemoryModel(2.0, ("twin:",), activations_per_position=512 << 10)  # the twins in a simulator child


# --- onnxruntime model packages (`package: true`, plan/packages.py) -----------------------------------------

class PackageVariantParams(TypedDict):
    package: str
    variant: str  # the variant directory: the target's name (+ the toolchain variant's suffix)


class PackageVariant(Kind):
    """One deliverable's files (wrappers and binary) copied into its variant directory of the recipe's model
    package, once its verifications passed."""
    name = "package_variant"
    implementation = "ctxbuild.actions.package_variant"
    params = PackageVariantParams


class ModelPackageParams(TypedDict):
    name: str
    variants: list[dict[str, Any]]  # declaration order: component, variant, its wrapper's and verifications' input
    # roles, target, toolchain, shares_context (a weight-shared binary)


class ModelPackage(Kind):
    """manifest.json of an onnxruntime model package over a recipe's variant directories, written with
    onnxruntime's ModelPackage API and opened again with its reader."""
    name = "model_package"
    implementation = "ctxbuild.actions.model_package"
    params = ModelPackageParams
    deliverable = True  # listed in OUT/manifest.json (kind model_package, no target)
    verified_here = False  # its variants were verified before they were copied in: no verification note
