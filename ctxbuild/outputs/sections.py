"""Checking qnn.lora_config files (LoRAv2 sections made elsewhere) against the binary they are for, for `ctxbuild
check`: every line `<graph name>;<section path>` must name a graph of the context binary beside the config (read with
libQnnSystem, not taken from the config or the wrapper's file name), and its section must exist and, in a build's
OUT, be one the manifest packaged for that same recipe and target: a section ctxbuild copied for another base
binary is one built for another binary. What the section's bytes were made for cannot be told here (they are opaque
without the QAIRT SDK: docs/limitations.md)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.graph.protowire import wrapper_facts


def config_problems(config: Path, packaged: dict[str, str] | None = None, owner: str | None = None) -> list[str]:
    """One line per problem of `config`. `packaged`: OUT-relative section path -> "<recipe>@<target>" that packaged
    it (from a manifest), `owner` this config's "<recipe>@<target>"; None for a config checked on its own."""
    from ctxbuild.qnn.contextbin import read_binary_info

    graphs: dict[str, str] = {}  # graph name -> binary
    for wrapper in sorted(config.parent.glob("*_ctx*.onnx")):
        for rel in wrapper_facts(wrapper)["binaries"]:
            if rel and (b := config.parent / rel).is_file():
                graphs.update({g["name"]: b.name for g in read_binary_info(str(b), path=b)["graphs"]})
    if not graphs:
        return [f"{config}: no context binary beside it (its wrapper's .bin) to check the graph names against"]
    problems = []
    lines = [x for x in config.read_text().splitlines() if x.strip()]
    if not lines:
        problems.append(f"{config}: empty; each line is `<graph name>;<section path>`")
    for i, line in enumerate(lines, 1):
        graph, sep, section = line.partition(";")
        if not sep:
            problems.append(f"{config}:{i}: not `<graph name>;<section path>`: {line!r}")
            continue
        if graph.strip() not in graphs:
            problems.append(f"{config}:{i}: graph '{graph.strip()}' is not in {', '.join(sorted(set(graphs.values())))} "
                            f"(its graphs: {', '.join(sorted(graphs))})")
        path = Path(section.strip())
        path = path if path.is_absolute() else config.parent / path
        if not path.is_file():
            problems.append(f"{config}:{i}: section {section.strip()} not found (relative paths are from the config's "
                            "directory)")
        elif packaged is not None:
            out = config.resolve().parents[2]  # OUT/<target>/<recipe>/<name>.lora_config
            real = path.resolve()
            rel = str(real.relative_to(out)) if real.is_relative_to(out) else None
            if rel in packaged and packaged[rel] != owner:
                problems.append(f"{config}:{i}: section {section.strip()} was packaged for {packaged[rel]}'s binary, "
                                f"not {owner}'s")
    return problems


def manifest_problems(out: Path, manifest: Any) -> list[str]:
    """config_problems of every lora_config a build's manifest lists. Only well-formed entries whose files stay
    inside OUT are read: the deploy gate's check judges a malformed manifest or a path leading out of OUT."""
    adapters = manifest.get("adapters") if isinstance(manifest, dict) else None
    entries = [(f"{e.get('recipe')}@{(e.get('target') or {}).get('name')}", _files_inside(out, e.get("files")))
               for e in (adapters if isinstance(adapters, list) else [])
               if isinstance(e, dict) and e.get("kind") == "lora_v2_section" and isinstance(e.get("target"), dict)]
    packaged = {f: owner for owner, files in entries for f in files if not f.endswith(".lora_config")}
    return [problem for owner, files in entries for f in files if f.endswith(".lora_config")
            for problem in config_problems(out / f, packaged, owner)]


def _files_inside(out: Path, files: Any) -> list[str]:
    """The relative paths of a manifest entry's files that resolve inside OUT (never followed out of it)."""
    paths = [f.get("path") for f in files if isinstance(f, dict)] if isinstance(files, list) else []
    root = out.resolve()
    return [p for p in paths if isinstance(p, str) and not Path(p).is_absolute() and ".." not in Path(p).parts
            and (out / p).resolve().is_relative_to(root)]


def read_manifest(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
