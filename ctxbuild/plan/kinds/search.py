"""precision: auto: the kinds that screen, gate, diagnose and pick the search's candidates (plan/search.py)."""
from __future__ import annotations

from typing import Any, TypedDict

from ctxbuild.plan.kinds.base import Kind, MemoryModel, Shape


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
    decides_gate = True


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
