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
- `legalizes`: it rewrites the user's model for the HTP (graph/legalize): its record lists the rewrites made and
  the rules its sample check withdrew (summary, report lineage);
- `per_layer`: `verify --layers` can diagnose its graph node by node against the float model (cli/layers.py);
- `binds_adapter`: it runs a graph with one LoRA adapter bound, named after the `+` in its id (report rows);
- `package_part`: its outputs are part of a model package (a variant's files): a build that did not make the
  package's manifest sets them aside with it (engine/finish.py), so no package is left without its manifest;
- `decides_gate`: it writes a precision search's gate (`{"run": ...}`): its progress line says the answer;
- `verified_here`: False for deliverables ctxbuild did not build (prebuilt binaries): no verification note;
- `memory`: its measured peak-memory model (memory.py schedules and checks actions by it).

Adding a kind: a class in its family's module beside this one and its implementation module (see docs/internals.md, "Adding an action kind").
"""
from __future__ import annotations

import importlib
from types import ModuleType
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar


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
    legalizes: ClassVar[bool] = False
    per_layer: ClassVar[bool] = False
    binds_adapter: ClassVar[bool] = False
    package_part: ClassVar[bool] = False
    decides_gate: ClassVar[bool] = False
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


Shape = dict[str, list[int]]  # input name -> fixed dims
