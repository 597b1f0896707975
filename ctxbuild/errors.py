"""Errors a user can hit. Each carries a one-line cause and a hint; the CLI prints them without a traceback."""
from __future__ import annotations

import errno
import re
import resource
from typing import Any

# A recipe error's `file:line: ` (or a whole file's `file.yaml: `), as editors and compilers print them.
_LOCATED = re.compile(r"(?P<file>[^\s:][^:\n]*?)(?::(?P<line>\d+))?: (?P<message>.*)", re.S)


class CtxbuildError(Exception):
    """Base class. `exit_code` is what the CLI returns: 2 for bad input/usage, 1 for a failed build."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        message = _one_line(message)  # a key or path of the user's may hold a line break: the error stays one line
        super().__init__(message)
        self.message = message
        self.hint = None if hint is None else _one_line(hint)

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def fields(self) -> dict[str, Any]:
        """The error as `--json` reports it: file and line apart when the message starts with them."""
        located = _LOCATED.fullmatch(self.message)
        if located is None or located["line"] is None and not located["file"].endswith((".yaml", ".yml")):
            return {"file": None, "line": None, "message": self.message, "hint": self.hint}
        return {"file": located["file"], "line": None if located["line"] is None else int(located["line"]),
                "message": located["message"], "hint": self.hint}


class UsageError(CtxbuildError):
    """Bad command line."""

    exit_code = 2


class RecipeError(CtxbuildError):
    """A recipe or defaults file is wrong; the message starts with `file:line:`."""

    exit_code = 2


class PlanError(RecipeError):
    """The recipes are individually valid but the action graph is not (duplicate outputs, cycles, ...)."""


class ActionError(CtxbuildError):
    """An action failed while building (bad model, QNN rejected a node, ...)."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, details: dict | None = None) -> None:
        super().__init__(message, hint)
        self.details = details  # structured result worth keeping in the record (e.g. failed metrics)


class SectionConfigError(CtxbuildError):
    """A qnn.lora_config file that does not fit the binary beside it (a graph name it lacks, another binary's section)."""

    exit_code = 2


class SampleError(ActionError):
    """A sample file's values cannot be fed to the model as they are (a cast would change them): bad input, exit 2."""

    exit_code = 2


class InspectError(CtxbuildError):
    """A context binary cannot be read (missing, truncated, corrupt, not a QNN binary)."""

    exit_code = 1


class CacheError(CtxbuildError):
    """A cache problem. Never fatal: `cache.Cache` turns each into one warning and the build goes on."""


class CacheUnavailable(CacheError):
    """The local cache directory cannot be read or written (full, read-only, not a directory)."""


class RemoteUnavailable(CacheUnavailable):
    """The remote cache is unreachable, timed out, failed (5xx) or refused the credentials."""


class CorruptEntry(CacheError):
    """A remote record or blob failed validation (poisoned or corrupt); it was not used."""

    def __init__(self, message: str, hint: str | None = None, digest: str | None = None) -> None:
        super().__init__(message, hint)
        self.digest = digest  # the bad blob's name: the rebuilt content is uploaded over it


# onnxruntime prefixes its messages with where in its source they were raised:
# "/onnxruntime_src/.../x.cc:393 virtual std::unique_ptr<...> f(...) [ONNXRuntimeError] : 1 : FAIL : <the cause>".
_ORT_PREFIX = re.compile(r"^.*?\[ONNXRuntimeError\] : \d+ : \w+ : ")


def cause_line(e: BaseException | str, last: bool = False, limit: int = 300) -> str:
    """One line of an exception's (or a tool's output's) text for a message: the first line (the last with
    `last`, where tools print the cause at the end), onnxruntime's source-location prefix dropped, at most
    `limit` characters cut at a word with "..." (the whole text stays in the action's log)."""
    text = e if isinstance(e, str) else str(e)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return "no output" if isinstance(e, str) else type(e).__name__
    line = _ORT_PREFIX.sub("", lines[-1] if last else lines[0])
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."


def machine_limit(e: BaseException) -> str | None:
    """One line for a failure the machine caused, not the build (a full disk, a quota, a file-size limit),
    which gets no traceback; None for anything else. A library that hides the OSError behind its own
    message (onnxruntime: "Failed to write context cache file") is recognised by the limit being set."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    note = f" (the file-size limit, `ulimit -f`, is {limit} bytes)" if limit != resource.RLIM_INFINITY else ""
    if isinstance(e, OSError) and e.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror}{note if e.errno == errno.EFBIG else ''}"
    text = cause_line(e)
    if note and "write" in text.lower():
        return f"{type(e).__name__}: {text}{note}"
    return None


class ExecutorUnavailable(CtxbuildError):
    """The remote executor (a Dask scheduler) cannot be reached or has no workers."""

    exit_code = 1


def _one_line(text: str) -> str:
    """Line breaks shown as escapes (found by tests/e2e/test_fuzz.py: a YAML key '\\n' made a two-line error)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")
