"""The argument parser, built from the command table: a `Command` per subcommand, the options every command
takes (-C, -v, -q), one-line usage errors, and `--version`."""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from ctxbuild.errors import UsageError

EXAMPLES = """examples:
  ctxbuild build                       build recipes/ into out/ (what `make build` runs)
  ctxbuild -C firmware build -q        as make -C: run in firmware/, print only errors
  ctxbuild build --json > result.json  one JSON document with the results
  ctxbuild targets                     the SoCs, their aliases and device names
  ctxbuild completion bash > ~/.local/share/bash-completion/completions/ctxbuild"""


class Command(NamedTuple):
    """One subcommand: its module declares it, the table in ctxbuild/cli/commands/__init__.py lists it.
    (A NamedTuple, not a dataclass: every command line reads the table, `dataclasses` costs an import.)"""

    name: str
    help: str | None  # the line in `ctxbuild --help`; None: internal (what ninja and the driver run), never listed
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the exit code: 0 ok, 1 failed, 2 bad input
    examples: str | None = None  # the end of its --help
    description: str | None = None  # the head of an internal command's --help
    ctrl_c: bool = True  # False: it handles SIGINT itself (an action, the worker), not main()'s way


class Parser(argparse.ArgumentParser):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, formatter_class=argparse.RawDescriptionHelpFormatter, **kw)

    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep our one-line format
        typo = re.match(r"argument COMMAND: invalid choice: '([^']*)'", message)
        if typo:
            from ctxbuild.recipes.suggest import did_you_mean

            public = getattr(self, "public", [])
            raise UsageError(f"unknown command '{typo[1]}'",
                             did_you_mean(typo[1], public, otherwise=f"commands: {', '.join(public)}"))
        where = self.prog.removeprefix("ctxbuild").strip()  # main() prints "ctxbuild: error: " before it
        raise UsageError(f"{where + ': ' if where else ''}{message}", f"see `{self.prog} --help`")


def build(commands: Sequence[Command]) -> Parser:
    """The whole command line. Internal commands get no help= line: argparse then leaves them out of --help,
    and the COMMAND metavar keeps them out of the usage line."""
    p = Parser(prog="ctxbuild", description="Build QNN context binaries and EPContext models from recipes.",
               epilog=EXAMPLES)
    _common(p, default=None)
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print ctxbuild's version and the toolchain its action keys depend on, then exit")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser, metavar="COMMAND")
    p.public = [c.name for c in commands if c.help is not None]  # type: ignore[attr-defined]
    p.set_defaults(parser=p)  # `completion` prints a script for the whole parser
    common = Parser(add_help=False)
    _common(common, default=argparse.SUPPRESS)  # after the command: only when given, else the global value
    for c in commands:
        if c.help is None:
            sp = sub.add_parser(c.name, description=c.description)
        else:
            sp = sub.add_parser(c.name, help=c.help, parents=[common], epilog=c.examples)
        c.arguments(sp)
        sp.set_defaults(command=c)
    return p


def _common(p: argparse.ArgumentParser, *, default: Any) -> None:
    """-C, -v, -q: accepted before the command (`ctxbuild -q build`) and after it (`ctxbuild build -q`)."""
    p.add_argument("-C", dest="directory", type=Path, metavar="DIR", default=default,
                   help="change to DIR before doing anything (as make -C, git -C, ninja -C; default: stay in the current "
                        "directory)")
    p.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="more output: the commands ninja runs, failed edges' command lines")
    p.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="errors only: no progress lines, no summary")


class _Version(argparse.Action):
    """`ctxbuild --version`: like `ninja --version` or `ccache -V`, plus what the action keys depend on."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        from ctxbuild import __version__
        from ctxbuild.toolchain import installed as toolchain

        print(f"ctxbuild {__version__}")
        for name, value in toolchain.summary(None).items():
            print(f"  {name:<17} {value}")
        parser.exit()
