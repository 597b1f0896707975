"""Jinja templates, shipped as the data package ctxbuild.templates (pyproject maps templates/ to it)."""
