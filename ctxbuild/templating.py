"""The Jinja templates (top-level templates/, shipped as the data package ctxbuild.templates), wheel or editable."""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

PACKAGE = "ctxbuild.templates"  # pyproject maps it to templates/: an editable install finds it there too


def template_dir() -> Path:
    return Path(str(resources.files(PACKAGE)))


def environment(**options: Any) -> Any:
    """A jinja2 Environment over the templates; `options` as jinja2.Environment takes them."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(template_dir()),
                              undefined=jinja2.StrictUndefined, **options)


def template_file(name: str) -> Path:
    """The template's file on disk (ninja watches it: a new ctxbuild re-renders build.ninja)."""
    return template_dir() / name
