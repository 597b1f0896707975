"""What a toolchain's pip install is doing, said while it runs: which package it downloads, how many bytes of it
have come, how many packages are done. Read from pip's own output with `--progress-bar raw` (pip >= 24.1 prints
`Progress <bytes> of <total>` lines); an older pip gives package lines and a heartbeat. On a terminal one status
line is rewritten in place; elsewhere (CI logs) a line every `every` seconds, and one per package."""
from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO


_COLLECTING = re.compile(r"^Collecting (\S+)")
_DOWNLOADING = re.compile(r"^\s*Downloading (\S+) \(([^)]*)\)")
_CACHED = re.compile(r"^\s*(?:Using cached|Processing) (\S+)")
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_INSTALLING = re.compile(r"^Installing collected packages: (.*)$")
RAW_UNSUPPORTED = "invalid choice: 'raw'"  # pip < 24.1: `--progress-bar raw` is a usage error


class PipProgress:
    """Feed it pip's stdout lines; it calls `say` (a lasting line) and `live` (a status line a terminal rewrites;
    None: not a terminal, so `say` every `every` seconds instead)."""

    def __init__(self, packages: int, say: Callable[[str], None], live: Callable[[str], None] | None,
                 every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.packages, self.say, self.live, self.every, self.clock = packages, say, live, every, clock
        self.started = self.last = clock()
        self.done = 0  # packages downloaded (or taken from pip's cache)
        self.current: str | None = None  # the wheel being downloaded
        self.size = ""  # its size as pip says it ("98.7 MB")
        self.got = self.total = 0  # its bytes so far, of
        self.downloaded = 0  # bytes of the wheels done
        self.phase = "starting pip"  # what a heartbeat says pip is doing while it says nothing
        self.lock = threading.Lock()

    def feed(self, line: str) -> None:
        line = line.rstrip("\n")
        with self.lock:
            if m := _PROGRESS.match(line):
                self.got, self.total = int(m[1]), int(m[2])
                if self.current is not None:
                    self._status(False)
                return
            if m := _COLLECTING.match(line):
                self.phase = f"looking up {m[1]}"
            elif m := _DOWNLOADING.match(line):
                if m[1].endswith(".metadata"):  # the wheel's metadata first (PEP 658): a few kB, not a package
                    self.current = None
                    return
                self._finish_download()
                self.current, self.size, self.got, self.total = m[1], m[2], 0, 0
                self._say(f"downloading {m[1]} ({m[2]}), package {self.done + 1} of {self.packages}")
            elif m := _CACHED.match(line):
                self._finish_download()
                self.done += 1
                self._say(f"using {m[1].rsplit('/', 1)[-1]} from pip's cache or a local index, package {self.done} of "
                          f"{self.packages}")
            elif m := _INSTALLING.match(line):
                self._finish_download()
                self.phase = "installing (unpacking)"
                self._say(f"downloaded {megabytes(self.downloaded)}; installing {m[1]} (unpacking)")

    def heartbeat(self) -> None:
        """Off a terminal, while pip is silent (unpacking; an older pip's download): a line every `every` s."""
        with self.lock:
            if self.live is None and self.clock() - self.last >= self.every:
                self._status(True)

    def _finish_download(self) -> None:
        if self.current is not None:
            self.downloaded += self.total or self.got
            self.done += 1
            self.current = None

    def _status(self, force: bool) -> None:
        secs = self.clock() - self.started
        if self.current is not None:
            of = f" of {megabytes(self.total)}" if self.total else f" of {self.size}"
            text = f"downloading {self.current}: {megabytes(self.got)}{of}, {secs:.0f} s"
        else:
            text = f"{self.phase}, {secs:.0f} s"
        if self.live is not None:
            self.live(f"ctxbuild: toolchain: {text}")
        elif force or self.clock() - self.last >= self.every:
            self._say(text)

    def _say(self, text: str) -> None:
        self.last = self.clock()
        self.say(f"ctxbuild: toolchain: {text}")


def megabytes(n: int) -> str:
    """In pip's own unit (it says "98.7 MB"): decimal megabytes."""
    return f"{n / 1e6:.1f} MB"


def run_pip(cmd: list[str], packages: int, say: Callable[[str], None], live: Callable[[str], None] | None,
            every: float = 10.0, **popen: object) -> subprocess.CompletedProcess[str]:
    """`cmd` (a `pip install`) with its progress said as it goes; pip's stderr is kept for the error line. An
    older pip that has no raw progress bar is run again without it."""
    result = _run(cmd + ["--progress-bar", "raw"], PipProgress(packages, say, live, every), **popen)
    if result.returncode != 0 and RAW_UNSUPPORTED in result.stderr:
        result = _run(cmd + ["--progress-bar", "off"], PipProgress(packages, say, live, every), **popen)
    return result


def _run(cmd: list[str], progress: PipProgress, **popen: object) -> subprocess.CompletedProcess[str]:
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(1.0):
            progress.heartbeat()

    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen) as p:  # type: ignore[call-overload]
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.extend(_lines(p.stderr)), daemon=True)
        reader.start()
        ticker = threading.Thread(target=beat, daemon=True)
        ticker.start()
        assert p.stdout is not None
        for line in iter(p.stdout.readline, ""):  # as pip writes them
            progress.feed(line)
        p.wait()
        stop.set()
        reader.join()
    return subprocess.CompletedProcess(cmd, p.returncode, "", "".join(err))


def _lines(pipe: IO[str] | None) -> list[str]:
    return list(iter(pipe.readline, "")) if pipe is not None else []
