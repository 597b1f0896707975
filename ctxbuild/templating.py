"""The package's Jinja templates (ctxbuild/templates/), loaded from the installed package, wheel or editable."""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

PACKAGE_DIR = "templates"


def environment(**options: Any) -> Any:
    """A jinja2 Environment over the package's templates; `options` as jinja2.Environment takes them."""
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader("ctxbuild", PACKAGE_DIR),
                              undefined=jinja2.StrictUndefined, **options)


def template_file(name: str) -> Path:
    """The template's file on disk (ninja watches it: a new ctxbuild re-renders build.ninja)."""
    return Path(str(resources.files("ctxbuild") / PACKAGE_DIR / name))
