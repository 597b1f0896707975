"""LLMs (ctxbuild/llm/, plan/llm.py): the decoder's static graphs, quantized per part; bundle and compile do the
rest."""
from __future__ import annotations

from typing import Any, TypedDict

from ctxbuild.plan.kinds.base import Kind, MemoryModel


class _LlmSplitRequired(TypedDict):
    parts: int
    sequence_lengths: list[int]
    context_lengths: list[int]
    graphs: list[str]
    check: dict[str, int]  # prompts and tokens the greedy check of the static graphs decodes; original_tokens:
    # the original's greedy tokens kept in layout.json for llm_genai


class LlmSplitParams(_LlmSplitRequired, total=False):
    adapter_slots: dict[str, Any]  # llm.adapters: slot patterns and scaling; slots become inputs with defaults
    alpha: dict[str, Any]  # switch: alpha: the adapters attached as branches gated by lora_alpha
    split_code: str  # the digest of the code making the graphs (plan/llm.py SPLIT_CODE): a change re-splits


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
    quantization: dict[str, Any]  # llm.quantization with its defaults (w4a16, w8a16, auto): how weights are made
    thresholds: dict[str, float]  # precision auto: the part check's gates and the quality gates (auto_precision.share)


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
    context_lengths: list[int]  # [segment]: what the memory estimate's activations count


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
    context_lengths: list[int]  # [context_length], for the memory estimate
    thresholds: dict[str, float]  # max_ppl_ratio, min_agreement: failing them, the weights alone are measured too


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
    context_lengths: list[int]  # [context_length], for the memory estimate
    precision: str
    thresholds: dict[str, float]  # max_ppl_ratio, min_agreement
    subset: dict[str, int]  # llm.eval.simulator as given: windows, prompts, tokens (the action adds the defaults by size)
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
    # the twins in a simulator child, counted by the QDQ graphs they were compiled from (sized before the twins exist):
    # SmolLM2-135M's 0.38 GiB of twins (2 x 2 graphs' QDQ: 4 x ~0.1-0.14 GB counted) peaked at 0.71 GiB
    memory = MemoryModel(1.5, ("qdq:",), activations_per_position=512 << 10)
