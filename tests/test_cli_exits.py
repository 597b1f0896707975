"""How the CLI ends (issue 33): one JSON document on every exit under --json, a dry run that writes nothing, and
no process of the build left behind after a Ctrl-C. (A second `clean`: tests/test_safety.py.)"""
from __future__ import annotations

from pathlib import Path

from tests.conftest import keep_only
