"""The package's layout holds: no import circles between ctxbuild's modules (imports inside functions
count too: a lazy import is still a dependency), no private name imported from another module, the packages
in layers, and no module over 500 lines."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[2] / "ctxbuild"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(modules: dict[str, Path]) -> list[tuple[str, str, str, int]]:
    """(importer, imported module, name or "", line) for every import of a ctxbuild module."""
    edges = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges += [(name, a.name, "", node.lineno) for a in node.names if a.name in modules]
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                assert node.level == 0, f"{path}:{node.lineno}: relative import (ctxbuild imports absolutely)"
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    edges.append((name, sub, "", node.lineno) if sub in modules
                                 else (name, node.module, a.name, node.lineno))
    return edges


def test_no_import_circles() -> None:
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    graph.add_edges_from((a, b) for a, b, _, _ in _imports(modules) if a != b)
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def test_no_private_names_imported_across_modules() -> None:
    modules = _modules()
    private = [f"{modules[a].relative_to(PACKAGE.parent)}:{line}: {b}.{n}"
               for a, b, n, line in _imports(modules) if n.startswith("_") and not n.startswith("__")]
    assert not private, f"private names imported from other modules: {private}"


def test_every_module_says_what_it_owns() -> None:
    missing = [str(p.relative_to(PACKAGE.parent)) for p in _modules().values()
               if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring: {missing}"


# The packages' layers, bottom up: a package imports only from its own layer and those below (imports inside
# functions count). ctxbuild's top-level modules (errors, atomic, digests, layout, settings, machine, ...) are
# the base every package may use. docs/internals.md draws the same picture.
LAYERS = [
    ["cache", "graph"],  # content-addressed stores; ONNX graph surgery and legalization
    ["toolchain"],  # what is installed and provisioned, and how to reach the EP
    ["qnn"],  # the compiler, the simulator, context binaries, wrappers
    ["lora"],  # adapter files and the LoRA slots of a graph
    ["llm"],  # decoder conventions, static graphs, the genai pipeline
    ["recipes"],  # what the user declared, validated
    ["verify"],  # accuracy: measurements, gates, diagnosis
    ["plan"],  # recipes -> actions, the action key
    ["actions"],  # what each action kind runs
    ["outputs"],  # manifest, report, summary, the deploy gate
    ["engine"],  # ninja, the worker, the runner, the farm
    ["cli"],
]


def _package(module: str, modules: dict[str, Path]) -> str | None:
    """The subpackage a module belongs to, or None for a top-level module (the base)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or modules[module].name == "__init__.py" and len(parts) == 2 else None


def test_packages_import_only_downwards() -> None:
    modules = _modules()
    layer = {p: i for i, names in enumerate(LAYERS) for p in names}
    found = {_package(m, modules) for m in modules} - {None}
    assert found <= set(layer), f"packages with no layer in LAYERS: {sorted(found - set(layer))}"
    upward = sorted({f"{modules[a].relative_to(PACKAGE.parent)}:{line}: {pa} -> {pb} ({b})"
                     for a, b, _, line in _imports(modules)
                     if (pa := _package(a, modules)) and (pb := _package(b, modules)) and pa != pb
                     and layer[pb] >= layer[pa]})
    base_up = sorted(f"{modules[a].relative_to(PACKAGE.parent)}:{line}: imports {b}"
                     for a, b, _, line in _imports(modules)
                     if _package(a, modules) is None and a != "ctxbuild.__main__" and _package(b, modules))
    assert not upward, "imports against the layers (or sideways within one):\n" + "\n".join(upward)
    assert not base_up, "top-level modules are the base; they import no package:\n" + "\n".join(base_up)


MAX_LINES = 500


def test_no_module_over_500_lines() -> None:
    """A module past 500 lines holds more than one job: split it along its seams, each piece named for its job."""
    sizes = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in _modules().values()}
    long = sorted(f"{name}: {n} lines" for name, n in sizes.items() if n > MAX_LINES)
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


def test_kind_names_are_spelled_only_in_plan() -> None:
    """Outside ctxbuild/plan/, code asks a kind's flags (kinds.get(name).verdict ...), never compares its name: a new
    kind is then its class and its implementation module (docs/internals.md, "Adding an action kind")."""
    from ctxbuild.plan import kinds

    names = {k.name for k in kinds.all_kinds()}
    found = []
    for name, path in _modules().items():
        if name.startswith(("ctxbuild.plan.", "ctxbuild.actions.")) or name == "ctxbuild.plan":
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source, str(path))):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            consts = {c.value for o in operands for c in ast.walk(o) if isinstance(c, ast.Constant)}
            text = ast.get_source_segment(source, node) or ""
            if consts & names and "kind" in text:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {text}")
    assert not found, "kind names compared outside plan/ (add a flag to plan/kinds/base.py):\n" + "\n".join(found)
