"""Action implementations, one module per kind. Each exposes:

- `discover_inputs(action) -> dict[name, Path]`: files read beyond the declared inputs (external data,
  calibration samples), found cheaply before running so they join the action key and ninja's depfile;
- `warnings(action) -> list[str]`: what the user must see whether the action runs or restores from cache;
- `summarize(action) -> dict`: facts about the placed outputs for the record (graph names, metrics);
- `run(ctx)`: write every output into `ctx.tmp` under its final file name; raise ActionError on bad input.
"""
from __future__ import annotations

from types import ModuleType

from . import bundle, compile, prebuilt, prepare, quantize, verify

IMPLEMENTATIONS: dict[str, ModuleType] = {
    "prepare": prepare, "quantize": quantize, "compile": compile, "bundle": bundle, "verify": verify,
    "prebuilt": prebuilt,
}
