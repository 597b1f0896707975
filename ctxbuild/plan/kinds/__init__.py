"""Action kinds by family: one module per family registers its kinds by subclassing `Kind` (base.py); importing
this package registers them all. Nothing else keeps a list of kind names: the rest of ctxbuild reads the flags.

Adding a kind: a class in its family's module and its implementation module (docs/internals.md)."""
from ctxbuild.plan.kinds.base import HOOK_DEFAULTS, Kind, MemoryModel, Shape, all_kinds, get, names
from ctxbuild.plan.kinds import adapters, build, llm, packages, search  # noqa: F401 - registers the kinds

__all__ = ["HOOK_DEFAULTS", "Kind", "MemoryModel", "Shape", "all_kinds", "get", "names"]
