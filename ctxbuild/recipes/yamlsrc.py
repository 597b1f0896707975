"""YAML loading that remembers line numbers, so every recipe error can say `file:line:`."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from ctxbuild.errors import RecipeError


class LineDict(dict):
    """A mapping from YAML that knows the line of itself and of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class LineList(list):
    line: int = 0
    item_lines: list[int]


# libyaml's parser when present (a 50 MB file: seconds, not 88 s); its nodes carry line marks too.
_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
PARSER = "python" if _Base is yaml.SafeLoader else "libyaml"
MAX_ITEMS = 1_000_000  # scalars + keys + containers after alias expansion: a "billion laughs" stops here
# Containers inside containers, through aliases too. Construction and validation recurse per level (400
# levels: a RecursionError; 100,000: libyaml's composer overflowed the C stack); a recipe needs about 5.
MAX_DEPTH = 64


class _Loader(_Base):  # type: ignore[misc,valid-type]
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    d = LineDict()
    d.line = node.start_mark.line + 1
    d.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            where = ".".join(_path(loader)) or "(top level)"
            text = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            # numbered names (a PyTorch export's tensor `391`) and YAML 1.1's yes/no/on/off are read as non-strings
            raise RecipeError(f"{key_node.start_mark.line + 1}: {where}: a key must be a string, got "
                              f"{type(key).__name__} {key!r}",
                              f"quote it: '{text}' (YAML reads {text} unquoted as {_AS.get(type(key), 'not a string')})"
                              if text else None)
        if key in d:
            raise RecipeError(f"{key_node.start_mark.line + 1}: duplicate key '{key}'", "remove one of them")
        _path(loader).append(key)  # the field a key below names, in its error
        d[key] = loader.construct_object(value_node, deep=True)
        _path(loader).pop()
        d.key_lines[key] = key_node.start_mark.line + 1
    return d


_AS = {int: "a number", float: "a number", bool: "a boolean", type(None): "null"}


def _path(loader: _Loader) -> list[str]:
    """The keys (and list indices) from the document's top to the node being constructed."""
    if not hasattr(loader, "field_path"):
        loader.field_path = []
    return loader.field_path


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    lst = LineList()
    for i, child in enumerate(node.value):
        _path(loader).append(str(i))
        lst.append(loader.construct_object(child, deep=True))
        _path(loader).pop()
    lst.line = node.start_mark.line + 1
    lst.item_lines = [child.start_mark.line + 1 for child in node.value]
    return lst


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    value = loader.construct_yaml_float(node)
    if not math.isfinite(value):  # .nan passes every schema bound (NaN compares false); .inf passes a minimum
        raise RecipeError(f"{node.start_mark.line + 1}: {node.value} is not a finite number",
                          "recipe fields take finite numbers")
    return value


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
# YAML 1.2 floats: PyYAML (YAML 1.1) reads `1e-3` and `1.0e30` as strings, which then fail a number field with a
# message about types; users write them as numbers.
_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*)?(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789."))
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_mapping(path: Path) -> LineDict:
    """Parse `path`; it must hold one YAML mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8 text", "recipes are YAML files") from None
    try:
        _check_depth(text)
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    except RecipeError as e:
        raise RecipeError(f"{path}:{e.message}", e.hint) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        tab = "\t" in line[:len(line) - len(line.lstrip())]  # editors hide it; PyYAML: "cannot start any token"
        raise RecipeError(f"{where}: invalid YAML: {problem}",
                          "the line is indented with a tab: YAML indents with spaces" if tab else None) from None
    _check_expanded_size(path, data)
    if not isinstance(data, LineDict):
        kind = "empty" if data is None else type(data).__name__
        raise RecipeError(f"{path}:1: a recipe must be a YAML mapping (key: value), got {kind}",
                          "see recipes/ for examples")
    return data


def _too_deep(where: str) -> RecipeError:
    return RecipeError(f"{where}: YAML nested more than {MAX_DEPTH} levels deep",
                       "a recipe is a few levels of mappings and lists")


def _check_depth(text: str) -> None:
    """Before anything is composed or constructed (both recurse per level): the parser's events are a
    flat stream, so counting the open containers costs no stack."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep(str(event.start_mark.line + 1))  # load_mapping adds the path
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_expanded_size(path: Path, data: Any) -> None:
    """Aliases share one constructed object, so loading is cheap; validating and merging walk every use.
    Count the items and levels as a walk would see them (memoized per object: linear in the file) and
    refuse a bomb, or an alias chain nesting deeper than MAX_DEPTH."""
    seen: dict[int, tuple[int, int]] = {}  # id -> (items, depth)

    def measure(o: Any, level: int) -> tuple[int, int]:
        if level > MAX_DEPTH:
            raise _too_deep(f"{path}:{getattr(o, 'line', 1)}")
        if id(o) not in seen:
            items = [*o.keys(), *o.values()] if isinstance(o, dict) else o if isinstance(o, list) else []
            inner = [measure(x, level + 1) for x in items]
            seen[id(o)] = (1 + sum(n for n, _ in inner), 1 + max((d for _, d in inner), default=0))
        elif level + seen[id(o)][1] - 1 > MAX_DEPTH:
            raise _too_deep(f"{path}:{getattr(o, 'line', 1)}")
        return seen[id(o)]

    total = measure(data, 0)[0]
    if total > MAX_ITEMS:
        raise RecipeError(f"{path}:1: YAML expands to {total:,} items through aliases/anchors (limit {MAX_ITEMS:,})",
                          "remove the alias chain; a recipe is a few dozen keys") from None


def line_of(root: Any, path: list[str | int]) -> int:
    """Best line for a location in loaded data: the deepest key/item we can find along `path`."""
    line = getattr(root, "line", 1)
    node = root
    for part in path:
        if isinstance(node, LineDict) and isinstance(part, str) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, LineList) and isinstance(part, int) and part < len(node):
            line = node.item_lines[part]
            node = node[part]
        else:
            break
    return line
