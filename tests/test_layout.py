"""The package's layout holds: no import circles between ctxbuild's modules (imports inside functions
count too: a lazy import is still a dependency), and no private name imported from another module."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "ctxbuild"


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
