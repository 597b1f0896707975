"""Action implementations, one module per kind. Each defines `run(ctx)`: write every output into `ctx.tmp`
under its final file name; raise ActionError on bad input. Optional hooks (defaults: nothing):

- `discover_inputs(action) -> dict[name, Path]`: files read beyond the declared inputs (external data,
  calibration samples), found cheaply before running so they join the action key and ninja's depfile;
- `warnings(action) -> list[str]`: what the user must see whether the action runs or restores from cache;
- `summarize(action) -> dict`: facts about the placed outputs for the record (graph names, metrics).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from . import adapter, bundle, compile, lora_sections, prebuilt, prepare, quantize, verify, verify_adapter

IMPLEMENTATIONS: dict[str, ModuleType] = {
    "prepare": prepare, "quantize": quantize, "compile": compile, "bundle": bundle, "verify": verify,
    "prebuilt": prebuilt, "adapter": adapter, "verify_adapter": verify_adapter, "lora_sections": lora_sections,
}
_DEFAULTS: dict[str, Callable[[Any], Any]] = {
    "discover_inputs": lambda action: {}, "warnings": lambda action: [], "summarize": lambda action: {},
}


def hook(kind: str, name: str) -> Callable[[Any], Any]:
    """The kind's `name` hook, or the default that does nothing."""
    return getattr(IMPLEMENTATIONS[kind], name, _DEFAULTS[name])
