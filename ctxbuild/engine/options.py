"""What a build was asked for: the options of `ctxbuild build` and `ctxbuild verify` (flags, or their
defaults), and the ninja targets they select."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxbuild.engine.console import Console
from ctxbuild.errors import UsageError


@dataclass
class BuildOptions:
    paths: list[Path]
    out: Path
    jobs: int | None = None
    keep_going: int = 0  # ninja -k: 0 never stops, so a multi-SoC build gives every SoC's verdict
    targets: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    only_flag: str = "--only"  # the flag that named them, for messages (`verify --layers` passes one)
    dry_run: bool = False
    compile_jobs: int | None = None
    explain: bool = False
    verify: bool = True
    verify_only: bool = False  # `ctxbuild verify`: only the verify edges (and what they need)
    cache_env: dict[str, str] = field(default_factory=dict)
    memory_budget: int | None = None  # bytes concurrent actions may use (default: available at start)
    executor: str | None = None  # a Dask scheduler address, or "local"
    executor_fallback: str | None = None  # "local": build here when the scheduler is unreachable
    set_aside_failed: bool = True  # a failed verification's artifacts leave OUT/<target>/ (not for --layers)
    console: Console = field(default_factory=Console)  # -q, -v, --json
    summary: bool = True  # end with the summary (built/restored/failed, accuracy, report path) or --json's document
    recipe_args: tuple[str, ...] = ()  # -C, PATHS, -o as given (quoted): the commands hints give repeat them


def default_compile_jobs() -> int:
    """HTP compiles of large graphs take several GB each: bound by memory as well as cores."""
    cpus = os.cpu_count() or 1
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = 8.0
    return max(1, min(cpus, int(mem_gb // 4)))


def make_dry_run(makeflags: str) -> bool:
    """`make -n` runs recipe lines marked `+` (so that recursive makes can print what they would do): GNU
    make passes its single-letter flags as MAKEFLAGS' first word ("n -j2 ...", "kns"). A `ctxbuild build`
    under `make -n` is a dry run, as a recursive $(MAKE) would be."""
    first = makeflags.split(" ", 1)[0] if makeflags else ""
    return not first.startswith("-") and "=" not in first and "n" in first


def ninja_targets(state: dict[str, Any], opts: BuildOptions) -> list[str]:
    if opts.verify_only:
        return ["verify"]
    recipes = sorted({r for a in state["actions"] for r in a["recipes"]})
    targets = sorted({a["target"]["name"] for a in state["actions"] if a["target"]})
    for name in opts.only:
        if name not in recipes:
            raise UsageError(f"{opts.only_flag} {name}: no such recipe", _close(name, recipes))
    if opts.targets:  # a device or marketing name selects its SoC's target ("Samsung Galaxy S24": SM8650)
        from ctxbuild.recipes.targets import lookup

        opts.targets = [n if n in targets or lookup(n) is None else lookup(n).name for n in opts.targets]
    for name in opts.targets:
        if name not in targets:
            raise UsageError(f"--target {name}: no recipe builds for it", _close(name, targets, n=3))
    if opts.only and opts.targets:
        pairs = [f"{r}@{t}" for r in opts.only for t in opts.targets]
        have = {f"{r}@{a['target']['name']}" for a in state["actions"] if a["target"] for r in a["recipes"]}
        return [p for p in pairs if p in have] or [f"recipe/{r}" for r in opts.only]
    if opts.only:
        return [f"recipe/{r}" for r in opts.only]
    if opts.targets:
        return [f"target/{t}" for t in opts.targets]
    return []


def selection(opts: BuildOptions) -> dict[str, list[str]]:
    """The recipes and targets the build was limited to (--only, --target; empty: all), after ninja_targets
    resolved device names: the summary and the report show only their rows."""
    return {"recipes": sorted(opts.only), "targets": sorted(opts.targets)}


def _close(name: str, options: list[str], n: int = 1) -> str:
    from ctxbuild.recipes.suggest import did_you_mean  # difflib: only for a bad name, not on every build

    return did_you_mean(name, options, otherwise=f"known: {', '.join(options) or 'none'}", n=n) or ""
