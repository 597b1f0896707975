"""What a build shows: progress lines (-q hides them, --json moves them to stderr), ninja's output with each
failure once and no internal command line, no escape codes under NO_COLOR or off a terminal."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import IO

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STATUS = re.compile(r"^\[\d+/\d+\] ")
# ninja 1.13.2 announces make's jobserver, and advises make >= 4.4 under make 4.3's pipe protocol (which it
# uses all the same): not the user's business on every call.
_JOBSERVER = ("ninja: Jobserver mode detected", "ninja: warning: Jobserver 'pipe' mode detected")


@dataclass
class Console:
    quiet: bool = False
    verbose: bool = False
    json: bool = False  # stdout carries one JSON document: everything else goes to stderr

    @property
    def stream(self) -> IO[str]:
        return sys.stderr if self.json else sys.stdout

    def info(self, line: str) -> None:
        """A progress or summary line: hidden by -q."""
        if not self.quiet:
            print(line, file=self.stream, flush=True)

    def ninja_env(self) -> dict[str, str]:
        """ninja colours `FAILED:` when CLICOLOR_FORCE is set (1.13 reads it; through a pipe it sees no
        terminal otherwise): never, the filter strips what it would write anyway."""
        return {"CLICOLOR_FORCE": "0"}

    def ninja_args(self) -> list[str]:
        return ["--quiet"] if self.quiet else ["-v"] if self.verbose else []

    def ninja_output(self, pipe: IO[bytes], stream: IO[str] | None = None) -> None:
        """Copy ninja's stdout, line by line as it comes: a failed edge's `FAILED: <outputs>` header and the
        command line ninja prints under it (`python -S .../client.py SPEC`: internal) are dropped unless
        --verbose, and so are `ninja: build stopped: subcommand failed.` (the driver names each failure once,
        with its cause and log, at the end) and ninja's jobserver notes. The action's own output stays.
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
            if not self.verbose and (line == "ninja: build stopped: subcommand failed." or line.startswith(_JOBSERVER)):
                continue
            if self.quiet and _STATUS.match(line):
                continue
            print(line, file=stream or self.stream, flush=True)

