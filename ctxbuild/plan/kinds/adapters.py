"""Several graphs in one binary, and the LoRA adapters bound to a compiled graph (plan/adapters.py)."""
from __future__ import annotations

from typing import Any, TypedDict

from ctxbuild.plan.kinds.base import Kind, MemoryModel
from ctxbuild.plan.kinds.build import Verify, VerifyParams


class _BundleRequired(TypedDict):
    provider_options: dict[str, str]
    cpu_fallback: bool
    precision: str
    graphs: list[str]


class BundleParams(_BundleRequired, total=False):
    adapters: bool  # LoRA: the wrappers get the slots' defaults from the float references
    shared_weights: bool  # each graph quantized by its own action: the weights they share are checked alike


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
    binds_adapter = True
    memory = Verify.memory


class VerifyAlphaParams(VerifyParams, total=False):
    alpha: dict[str, Any]  # switch: alpha: input name, targets, adapters (name, format, tensors, scale)


class VerifyAlpha(Kind):
    """An alpha-switched binary on the simulator per lora_alpha vector, against the float base with the adapters merged."""
    name = "verify_alpha"
    implementation = "ctxbuild.actions.verify_alpha"
    params = VerifyAlphaParams
    discovery_follows = "original"
    discovers_inputs = True
    uses_qnn = True
    verification = True
    verdict = True
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
