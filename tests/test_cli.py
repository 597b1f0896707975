"""Command-line conventions: --version, no internal subcommands in --help, a help line for every argument."""
from __future__ import annotations

import argparse
import re

import pytest

from ctxbuild.cli.main import _parser
from ctxbuild.toolchain.installed import version

INTERNAL = ("action", "worker", "regenerate")


def test_version_names_ctxbuild_and_the_keyed_toolchain(ctxbuild) -> None:
    r = ctxbuild("--version")
    assert r.code == 0, r.text
    from ctxbuild import __version__

    assert r.out.splitlines()[0] == f"ctxbuild {__version__}"
    fields = dict(line.split(None, 1) for line in r.out.splitlines()[1:])
    assert fields["onnxruntime"] == version("onnxruntime")
    assert fields["onnxruntime-qnn"] == version("onnxruntime-qnn")
    assert re.fullmatch(r"v\d+\.\d+\.\d+\.\d+", fields["qnn_sdk_build_id"]), fields


def test_help_lists_public_commands_only(ctxbuild) -> None:
    r = ctxbuild("--help")
    assert r.code == 0
    assert "SUPPRESS" not in r.out
    listed = re.findall(r"^    (\w+)\s", r.out, re.M)
    assert "build" in listed and "cache" in listed
    assert not set(INTERNAL) & set(listed) and not any(w in r.out.split("\n")[0] for w in INTERNAL)


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    todo, seen = [("ctxbuild", _parser())], []
    while todo:
        name, p = todo.pop()
        seen.append((name, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += [(f"{name} {n}", sp) for n, sp in a.choices.items()]
    return seen


@pytest.mark.parametrize("name,parser", _all_parsers(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_argument_has_help(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [a.dest for a in parser._actions
               if not isinstance(a, argparse._SubParsersAction) and a.help in (None, "", argparse.SUPPRESS)]
    assert not missing, f"{name}: no help for {missing}"
