"""Command-line conventions: --version, no internal subcommands in --help, a help line for every argument."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from ctxbuild.cli.main import parser
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
    todo, seen = [("ctxbuild", parser())], []
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


@pytest.mark.parametrize("name,parser", _all_parsers(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_option_states_its_default(name: str, parser: argparse.ArgumentParser) -> None:
    """Issue 33: `--help` says what each option that takes a value does when it is not given (-k, -j, -o...)."""
    formatter = parser._get_formatter()
    silent = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
              if not isinstance(a, argparse._SubParsersAction) and not a.required and a.nargs != 0
              and (a.option_strings or a.nargs in ("*", "?"))
              and "default" not in formatter._expand_help(a)]
    assert not silent, f"{name}: --help does not state the default of {silent}"


def test_keep_going_help_states_the_real_default(capsys: pytest.CaptureFixture[str]) -> None:
    from ctxbuild.engine.options import BuildOptions

    with pytest.raises(SystemExit):
        parser().parse_args(["build", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    default = BuildOptions([], Path()).keep_going
    assert default == 0 and "stop after N failed actions (0: never;" in help_text
    assert f"default: {default}, every SoC's verdict)" in help_text


def test_mistyped_command_is_one_line_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    from ctxbuild.cli.main import main

    assert main(["biuld"]) == 2
    err = capsys.readouterr().err
    assert err == "ctxbuild: error: unknown command 'biuld' (did you mean 'build'?)\n"
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "commands: build, verify" in err
    assert not any(w in err for w in INTERNAL) and "ctxbuild: error: ctxbuild" not in err


def test_every_command_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    from ctxbuild.cli.main import main

    for cmd in ("build", "verify", "inspect", "wrap", "plan", "completion"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert "examples:\n  ctxbuild " in out, cmd


def test_completion_script_knows_public_commands(capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    from ctxbuild.cli.main import main

    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    listed = re.search(r"^_shtab_ctxbuild_subparsers=\((.*)\)$", script, re.M)[1].split()
    assert "build" in listed and "completion" in listed and not set(INTERNAL) & set(listed)
    assert "--json" in re.search(r"^_shtab_ctxbuild_build_option_strings=\((.*)\)$", script, re.M)[1].split()
    # bash loads it and completes the command name
    probe = script + '\nCOMP_WORDS=(ctxbuild bu); COMP_CWORD=1; COMP_LINE="ctxbuild bu"; COMP_POINT=11\n' \
                     '_shtab_ctxbuild ctxbuild bu ctxbuild; echo "${COMPREPLY[@]}"\n'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout
    assert out.split()[-1] == "build", out


def test_dash_C_needs_an_existing_directory(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from ctxbuild.cli.main import main

    assert main(["-C", str(tmp_path / "nope"), "targets"]) == 2
    assert capsys.readouterr().err.startswith(f"ctxbuild: error: -C {tmp_path / 'nope'}: No such file")
    assert main(["-C", str(tmp_path), "targets", "--json"]) == 0 and capsys.readouterr().out.startswith("[")


def test_ninja_output_filter_drops_failed_headers_and_escapes(capsys: pytest.CaptureFixture[str]) -> None:
    import io

    from ctxbuild.engine.console import Console

    ninja = (b"[1/2] compile a@SM8650\n\x1b[31mFAILED: [code=1] \x1b[0mSM8650/a/a_verify.json \n"
             b"/venv/bin/python -S /x/ctxbuild/engine/run/client.py .ctxbuild/actions/verify.a.json\n"
             b"--- log of verify a@SM8650, last lines:\nboom\nninja: build stopped: subcommand failed.\n")
    Console().ninja_output(io.BytesIO(ninja))
    assert capsys.readouterr().out == "[1/2] compile a@SM8650\n--- log of verify a@SM8650, last lines:\nboom\n"
    Console(verbose=True).ninja_output(io.BytesIO(ninja))
    out = capsys.readouterr().out
    assert "FAILED: [code=1] SM8650" in out and "client.py" in out and "\x1b" not in out
    Console(quiet=True).ninja_output(io.BytesIO(ninja))
    assert capsys.readouterr().out == "--- log of verify a@SM8650, last lines:\nboom\n"


def test_ninja_verdict_lines_never_reach_the_user(capsys: pytest.CaptureFixture[str]) -> None:
    """ninja's own verdicts repeat what ctxbuild's summary says in ninja's words (issue 48): left out."""
    import io

    from ctxbuild.engine.console import Console

    for said in (b"ninja: no work to do.\n", b"ninja: build stopped: cannot make progress due to previous errors.\n",
                 b"ninja: build stopped: interrupted by user.\n"):
        Console().ninja_output(io.BytesIO(b"[1/1] verify a@SM8650\n" + said))
        assert capsys.readouterr().out == "[1/1] verify a@SM8650\n", said
    Console(verbose=True).ninja_output(io.BytesIO(b"ninja: no work to do.\n"))
    assert capsys.readouterr().out == "ninja: no work to do.\n"  # -v shows everything ninja says


def test_progress_leaves_out_placeholders_and_counts_without_them(capsys: pytest.CaptureFixture[str]) -> None:
    """A precision-search candidate an earlier one made unneeded only writes placeholders: its progress line goes,
    and the lines after it count without it (issue 48: `compile ... (candidate fp16)` after a16w8 had passed)."""
    import io

    from ctxbuild.engine.console import Console

    ninja = b"[1/4] compile a@SM8650 (candidate a16w8)\n[2/4] compile a@SM8650 (candidate fp16)\n" \
            b"[3/4] verify a.fp16@SM8650\n[4/4] select a@SM8650 (2 candidates)\n"
    skipped = {"compile a@SM8650 (candidate fp16)", "verify a.fp16@SM8650"}
    Console(progress=lambda d: None if d in skipped else d).ninja_output(io.BytesIO(ninja))
    assert capsys.readouterr().out == "[1/4] compile a@SM8650 (candidate a16w8)\n[2/2] select a@SM8650 (2 candidates)\n"
