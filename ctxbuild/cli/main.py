"""The entry point: parse the command line (the table in cli/commands/), run the command, turn its errors into
one line and its exit code. Exit codes: 0 ok, 1 build failed, 2 bad input, 130 interrupted. Under --json an
error is a JSON document on stdout as well: `{"ok": false, "exit_code": N, "error": {file, line, message, hint}}`."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ctxbuild import settings
from ctxbuild.cli.commands import COMMANDS
from ctxbuild.cli.parser import build as build_parser
from ctxbuild.procs import interrupted, interrupted_by, note_interrupt
from ctxbuild.errors import CtxbuildError, UsageError, machine_limit


def parser() -> argparse.ArgumentParser:
    return build_parser(COMMANDS)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv  # until the command line parses: its own mistakes answer in JSON too
    try:
        args = parser().parse_args(argv)
        as_json = bool(getattr(args, "json", False))
        for warning in settings.check_all():  # a bad CTXBUILD_* value is one line here, not a failure of every action
            print(f"ctxbuild: warning: {warning}", file=sys.stderr)
        if args.directory is not None:
            _chdir(args.directory)
        if args.command.ctrl_c:
            catch_ctrl_c()
        for p in getattr(args, "paths", []):  # before OUT's placement is judged against a file that is not there
            if not p.exists():
                where = "" if p.is_absolute() else f" in {Path.cwd()}"
                raise UsageError(f"{p}: no such file or directory{where}",
                                 "give recipe files or directories (default: recipes), or -C the project's directory")
        code = args.command.run(args)
        # A Ctrl-C whose KeyboardInterrupt was lost: the command finished, its --json document is out already.
        return _interrupted(as_json=False) if interrupted() else code
    except KeyboardInterrupt:
        return _interrupted(as_json)
    except CtxbuildError as e:
        if interrupted():  # e.g. a failure caused by the interrupt itself
            return _interrupted(as_json)
        return _error(e.exit_code, str(e), e.fields(), as_json)
    except BrokenPipeError:  # `ctxbuild targets | head`: entry() handles it
        raise
    except OSError as e:  # a full or read-only OUT, outside any action: one line, not a traceback
        if interrupted():
            return _interrupted(as_json)
        if line := machine_limit(e):
            return _error(1, line, _fields(line), as_json)
        return _error(1, f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}",
                      _fields(str(e.strerror or e), file=None if e.filename is None else str(e.filename)), as_json)
    except Exception as e:
        if interrupted():  # an interrupt inside an import can surface as ImportError
            return _interrupted(as_json)
        if line := machine_limit(e):  # e.g. the toolchain probe's compile under `ulimit -f`
            return _error(1, line, _fields(line), as_json)
        raise


def _error(code: int, line: str, fields: dict[str, Any], as_json: bool) -> int:
    """The one line on stderr; under --json the document on stdout too (nothing else was printed there)."""
    print(f"ctxbuild: error: {line}", file=sys.stderr)
    if as_json:
        print(json.dumps({"ok": False, "exit_code": code, "error": fields}, indent=2))
    return code


def _fields(message: str, *, file: str | None = None) -> dict[str, Any]:
    return {"file": file, "line": None, "message": message, "hint": None}


def catch_ctrl_c() -> None:
    """Ctrl-C (and SIGTERM, the same way: a cancelled CI job must not leave unverified files in OUT/<target>/
    either) raises KeyboardInterrupt wherever Python is. Where that is a weakref callback or a __del__ (the
    garbage collector runs them inside any allocation: planning imports networkx and jsonschema), Python
    cannot raise it: it printed 'Exception ignored in ... Traceback ... KeyboardInterrupt' and went on. The
    flag is set either way (the driver checks it before ninja and at the end: exit 130), so such a lost
    interrupt is dropped quietly; every other unraisable exception still goes to Python's own hook."""
    signal.signal(signal.SIGINT, _on_interrupt)
    signal.signal(signal.SIGTERM, _on_interrupt)
    default = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not (isinstance(unraisable.exc_value, KeyboardInterrupt) and interrupted()):
            default(unraisable)

    sys.unraisablehook = hook


def _chdir(directory: Path) -> None:
    """-C DIR: every relative path on the command line (recipes, -o, --cache-dir) is then relative to DIR."""
    try:
        os.chdir(directory)
    except OSError as e:
        raise UsageError(f"-C {directory}: {e.strerror}", "give an existing directory") from None


def _on_interrupt(signum: int, frame: object) -> None:
    note_interrupt(signum)
    for s in (signal.SIGINT, signal.SIGTERM):  # one is enough: the cleanup on the way out runs undisturbed
        signal.signal(s, signal.SIG_IGN)
    raise KeyboardInterrupt


def _interrupted(as_json: bool) -> int:
    """130 after Ctrl-C; after SIGTERM 143, which entry() turns into the death by SIGTERM callers expect."""
    term = interrupted_by() == signal.SIGTERM
    word, code = ("terminated", 143) if term else ("interrupted", 130)
    print(f"ctxbuild: {word}", file=sys.stderr)
    if as_json:
        print(json.dumps({"ok": False, "exit_code": code, "error": _fields(word)}, indent=2))
    return code


def entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `ctxbuild targets | head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    if code in (130, 143):
        # Interrupted. CPython remembers a KeyboardInterrupt that once escaped code it ran via PyRun_* (some
        # library imports do) and then ends itself with SIGINT at exit (-2, measured 3 in 40 Ctrl-Cs while
        # planning), whatever we return. Our cleanup is done: leave with our exit code, or after SIGTERM by it.
        sys.stdout.flush()
        sys.stderr.flush()
        if code == 143 and interrupted_by() == signal.SIGTERM:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
