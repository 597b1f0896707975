"""What a build shows: progress lines (-q hides them, --json moves them to stderr), ninja's output with each
failure once and no internal command line, no escape codes under NO_COLOR or off a terminal."""
from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ctxbuild.atomic import read_json
from ctxbuild.layout import record_path
from ctxbuild.plan import kinds

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STATUS = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
# ninja 1.13.2 announces make's jobserver, and advises make >= 4.4 under make 4.3's pipe protocol (which it
# uses all the same): not the user's business on every call.
_JOBSERVER = ("ninja: Jobserver mode detected", "ninja: warning: Jobserver 'pipe' mode detected")
# ninja's own verdicts: the summary says what happened (`ctxbuild: up to date`, each failure once with its cause),
# so `ninja: no work to do.` and `ninja: build stopped: ...` (subcommand failed, cannot make progress due to
# previous errors, interrupted by user) would only repeat it in ninja's words.
_NINJA_VERDICTS = ("ninja: no work to do.", "ninja: build stopped: ")


@dataclass
class Console:
    quiet: bool = False
    verbose: bool = False
    json: bool = False  # stdout carries one JSON document: everything else goes to stderr
    # a progress line's description -> what to show for it once the edge finished (None: not shown)
    progress: Callable[[str], str | None] | None = None
    _hidden: int = field(default=0, init=False)  # progress lines left out so far: the count shown skips them
    _live: int = field(default=0, init=False)  # the length of the status line a terminal shows (live), or 0

    @property
    def stream(self) -> IO[str]:
        return sys.stderr if self.json else sys.stdout

    def info(self, line: str) -> None:
        """A progress or summary line: hidden by -q."""
        if not self.quiet:
            if self._live:  # below the status line, which stays as it was last written
                print(file=self.stream)
                self._live = 0
            print(line, file=self.stream, flush=True)

    def tty(self) -> bool:
        return not self.quiet and self.stream.isatty()

    def live(self, line: str) -> None:
        """A status line rewritten in place (on a terminal: a carriage return, no escape codes); hidden by -q."""
        if not self.quiet:
            self.stream.write("\r" + line.ljust(self._live))
            self.stream.flush()
            self._live = len(line)

    def ninja_env(self) -> dict[str, str]:
        """ninja colours `FAILED:` when CLICOLOR_FORCE is set (1.13 reads it; through a pipe it sees no
        terminal otherwise): never, the filter strips what it would write anyway."""
        return {"CLICOLOR_FORCE": "0"}

    def ninja_args(self) -> list[str]:
        return ["--quiet"] if self.quiet else ["-v"] if self.verbose else []

    def ninja_output(self, pipe: IO[bytes], stream: IO[str] | None = None) -> None:
        """Copy ninja's stdout, line by line as it comes: a failed edge's `FAILED: <outputs>` header and the
        command line ninja prints under it (`python -S .../client.py SPEC`: internal) are dropped unless
        --verbose, and so are ninja's verdicts (`ninja: no work to do.`, `ninja: build stopped: ...`: the driver
        names each failure once, with its cause and log, at the end) and its jobserver notes. The action's own
        output stays.
        `stream`: where the lines go (default: the progress stream; ninja's stderr goes to stderr)."""
        skip_command = False
        for raw in iter(pipe.readline, b""):
            line = ANSI.sub("", raw.decode(errors="replace").rstrip("\n"))
            if skip_command:
                skip_command = False
                continue
            if not self.verbose and line.startswith("FAILED: "):
                skip_command = True
                continue
            if not self.verbose and line.startswith(_JOBSERVER + _NINJA_VERDICTS):
                continue
            if _STATUS.match(line) and (self.quiet or (line := self._progress(line)) is None):
                continue
            print(line, file=stream or self.stream, flush=True)

    def _progress(self, line: str) -> str | None:
        """ninja's `[3/12] compile ...` (printed when the edge finished: its record is written) as `progress` has
        it, or None for an edge that only wrote placeholders; the lines after one count without it."""
        m = _STATUS.match(line)
        assert m is not None
        shown = m[3] if self.progress is None else self.progress(m[3])
        if shown is None:
            self._hidden += 1
            return None
        return f"[{int(m[1]) - self._hidden}/{int(m[2]) - self._hidden}] {shown}"


def progress_lines(out: Path, actions: list[dict[str, Any]]) -> Callable[[str], str | None]:
    """Console.progress for OUT's plan, from the record of the action a description names (one two actions share
    is shown as is): None when it wrote only a precision search's placeholders (engine/runner.py: `not_needed`);
    a search step with its answer (`search tiny_cnn: need fp16? no: w8a16 passed`)."""
    by_description: dict[str, list[str]] = {}
    for a in actions:
        by_description.setdefault(a["description"], []).append(a["id"])

    def shown(description: str) -> str | None:
        ids = by_description.get(description) or []
        record = (read_json(record_path(out, ids[0])) or {}) if len(ids) == 1 else {}
        if record.get("not_needed"):
            return None
        if record.get("status") == "ok" and kinds.get(record["kind"]).decides_gate:
            why = dict.fromkeys(w.split(": not run: ", 1)[-1] for w in record.get("why_closed") or [])
            return f"{description} " + (f"no: {'; '.join(why)}" if why else "yes")
        return description

    return shown
