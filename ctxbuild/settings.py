"""Every CTXBUILD_* environment variable: its name, default and meaning, and the one place that reads them.

Values are read at call time, not at import: the driver sets some for the processes it starts (and for its
own later reads), and tests set them per test. A module that writes one for a child process writes
`SETTING.name`. One exception reads its variable itself: engine/run/client.py, run once per action without
site-packages, imports only C modules and so not this one (CTXBUILD_WORKER, see WORKER).
docs/outputs-and-cli.md ("Environment variables") lists them all; tests/unit/test_settings.py keeps that table and
this module in step.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str
    default: T
    meaning: str
    parse: Callable[[str], T]  # raises ValueError (saying what it expected) for a value it refuses

    def get(self, env: Mapping[str, str] | None = None) -> T:
        """Its value in `env` (default: this process's environment), else the default. A value `parse`
        refuses raises ValueError naming the variable."""
        raw = (os.environ if env is None else env).get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"{self.name}={raw!r}: {e}") from None


def _text(raw: str) -> str | None:
    return raw or None  # set but empty: as if unset


def _flag(raw: str) -> bool:
    return raw == "1"


def _link(raw: str) -> bool | None:
    return {"1": True, "0": False}.get(raw)  # anything else: as if unset


def _number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value) or value <= 0:  # inf or 0 made every transfer fail; a negative one blamed the token
        raise ValueError("expected a finite number above 0")
    return value


def _whole(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("expected a whole number") from None
    if value < 1:
        raise ValueError("expected a whole number, 1 or more")
    return value


def _log_level(raw: str) -> int:
    if raw.strip() not in ("0", "1", "2", "3", "4"):  # abc was reported as a failure of the QNN SDK's probe
        raise ValueError("expected onnxruntime's log severity, 0 (verbose) to 4 (fatal)")
    return int(raw)


def _json_object(raw: str) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"expected a JSON object ({e})") from None
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return value


def _fallback(raw: str) -> str | None:
    if raw not in ("", "fail", "local"):
        raise ValueError("expected fail or local")
    return raw or None


def _lenient_whole(raw: str) -> int | None:
    """For values the driver or worker sets for its children: anything else counts as unset."""
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def _children(raw: str) -> int | None:
    count = raw.strip()
    if not count:
        return None
    if not count.isdigit() or int(count) < 1:
        raise ValueError("expected a whole number of simulator children, 1 or more")
    return int(count)


# The cache (docs/caching.md). Flags and `cache:` in _defaults.yaml become these for every action.
NO_CACHE = Setting("CTXBUILD_NO_CACHE", False, "1: no cache at all, local or remote (--no-cache)", _flag)
CACHE_DIR = Setting("CTXBUILD_CACHE_DIR", None, "the local cache (--cache-dir); default: $XDG_CACHE_HOME/ctxbuild, "
                    "else ~/.cache/ctxbuild", _text)
CACHE_LINK = Setting("CTXBUILD_CACHE_LINK", None, "the local cache shares OUT's files by hard link (read-only files; "
                     "ccache's hard_link mode) instead of copying them in and out: 1 every file of 64 KiB or more, 0 "
                     "none; unset: files of 16 MiB or more", _link)
REMOTE_CACHE = Setting("CTXBUILD_REMOTE_CACHE", None, "the remote cache's URL; its scheme picks the backend "
                       "(--remote-cache, cache.remote)", _text)
REMOTE_READ_ONLY = Setting("CTXBUILD_REMOTE_READ_ONLY", False, "1: never upload to the remote cache "
                           "(--remote-read-only, cache.remote_read_only)", _flag)
REMOTE_TOKEN = Setting("CTXBUILD_REMOTE_TOKEN", None, "the remote cache's bearer token, unless "
                       "CTXBUILD_REMOTE_TOKEN_ENV names another variable; never written anywhere", _text)
REMOTE_TOKEN_ENV = Setting("CTXBUILD_REMOTE_TOKEN_ENV", REMOTE_TOKEN.name, "the variable holding the remote "
                           "cache's bearer token (cache.token_env)", str)
REMOTE_TIMEOUT = Setting("CTXBUILD_REMOTE_TIMEOUT", 10.0, "seconds to connect and for each read; a transfer of n "
                         "bytes gets this + n / CTXBUILD_REMOTE_MIN_RATE", _number)
REMOTE_MIN_RATE = Setting("CTXBUILD_REMOTE_MIN_RATE", float(256 << 10), "bytes/s below which a transfer is "
                          "abandoned, after the grace of one timeout", _number)
# Twice the 16 GiB of the biggest single-SoC context binaries Qualcomm ships for LLMs; a record declaring more
# is a broken or hostile server, or a farm that needs the limit raised.
REMOTE_MAX_DOWNLOAD = Setting("CTXBUILD_REMOTE_MAX_DOWNLOAD", 32 << 30, "the most one blob download may bring, in "
                              "bytes (--remote-max-download, cache.max_download)", _whole)

# The build and where its actions run (docs/farm.md).
EXECUTOR = Setting("CTXBUILD_EXECUTOR", None, "a Dask scheduler to run actions on, e.g. tcp://host:8786; "
                   "default: local (--executor, executor: in _defaults.yaml)", _text)
EXECUTOR_FALLBACK = Setting("CTXBUILD_EXECUTOR_FALLBACK", None, "local: build here when the scheduler is "
                            "unreachable; default: fail (--executor-fallback)", _fallback)
MEMORY_BUDGET = Setting("CTXBUILD_MEMORY_BUDGET", None, "bytes the build's concurrent actions may use; set by the "
                        "driver (--memory-budget, default: memory available at start)", _lenient_whole)
BUILD_ID = Setting("CTXBUILD_BUILD_ID", None, "the build an action runs for; set by the driver", _text)
FARM = Setting("CTXBUILD_FARM", None, "the socket of the driver's gateway to the Dask cluster; set by the driver "
               "for a build with an executor", _text)
WORKER = Setting("CTXBUILD_WORKER", None, "the socket of the driver's fork server (CTXBUILD_WORKER_<toolchain> for "
                 "a provisioned toolchain's); set by the driver, read by engine/run/client.py itself", _text)
MEMORY_ESTIMATE = Setting("CTXBUILD_MEMORY_ESTIMATE", None, "the action's memory estimate in bytes; set by the "
                          "fork server for the action it starts", _lenient_whole)

# Toolchains (docs/deploy.md).
TOOLCHAINS_DIR = Setting("CTXBUILD_TOOLCHAINS_DIR", None, "where provisioned toolchains live; default: "
                         "toolchains/ in $XDG_CACHE_HOME/ctxbuild, else ~/.cache/ctxbuild", _text)
WHEELHOUSE = Setting("CTXBUILD_WHEELHOUSE", None, "a directory of wheels: provision toolchains offline "
                     "(pip --no-index)", _text)
ORT_LOG_LEVEL = Setting("CTXBUILD_ORT_LOG_LEVEL", 2, "onnxruntime's log severity in actions (0 verbose .. 4 "
                        "fatal)", _log_level)
TOOLCHAIN_OVERRIDE = Setting("CTXBUILD_TOOLCHAIN_OVERRIDE", None, "for tests only: JSON merged into every "
                             "toolchain fingerprint, to pose as another toolchain", _json_object)

# Verification (docs/verification.md).
VERIFY_MEMO = Setting("CTXBUILD_VERIFY_MEMO", True, "0: do not memoize simulator and CPU outputs in the cache",
                      lambda raw: raw != "0")
VERIFY_WORKERS = Setting("CTXBUILD_VERIFY_WORKERS", None, "simulator children a verification runs side by side; "
                         "default: one per idle core, within memory", _children)

ALL: tuple[Setting, ...] = (NO_CACHE, CACHE_DIR, CACHE_LINK, REMOTE_CACHE, REMOTE_READ_ONLY, REMOTE_TOKEN, REMOTE_TOKEN_ENV,
                            REMOTE_TIMEOUT, REMOTE_MIN_RATE, REMOTE_MAX_DOWNLOAD, EXECUTOR, EXECUTOR_FALLBACK,
                            MEMORY_BUDGET, BUILD_ID, FARM, WORKER, MEMORY_ESTIMATE, TOOLCHAINS_DIR, WHEELHOUSE,
                            ORT_LOG_LEVEL, TOOLCHAIN_OVERRIDE, VERIFY_MEMO, VERIFY_WORKERS)


def check_all(env: Mapping[str, str] | None = None) -> list[str]:
    """Every setting read once, at start: a value its parse refuses is one line naming the variable (exit 2), not a
    failure of every action, or of whatever reads it first. Returns a warning for each CTXBUILD_* variable that is
    no setting but close to one (CTXBUILD_CACHE for CTXBUILD_CACHE_DIR: silently ignored, the build would fill
    the default cache)."""
    from difflib import get_close_matches

    from ctxbuild.errors import UsageError

    for setting in ALL:
        try:
            setting.get(env)
        except ValueError as e:
            raise UsageError(str(e), "unset it or correct it (docs/outputs-and-cli.md lists every variable)") from None
    known = sorted(s.name for s in ALL)
    warnings = []
    for name in sorted(os.environ if env is None else env):
        if name.startswith("CTXBUILD_") and name not in known and not name.startswith(f"{WORKER.name}_"):
            near = get_close_matches(name, known, n=3, cutoff=0.75)
            if near:
                names = near[0] if len(near) == 1 else f"{', '.join(near[:-1])} or {near[-1]}"
                warnings.append(f"{name} is not a ctxbuild setting and is ignored: did you mean {names}? "
                                "(docs/outputs-and-cli.md lists every variable)")
    return warnings


def remote_token(env: Mapping[str, str] | None = None) -> str | None:
    """The remote cache's token as set (uncleaned): the variable CTXBUILD_REMOTE_TOKEN_ENV names."""
    return (os.environ if env is None else env).get(REMOTE_TOKEN_ENV.get(env)) or None


def user_cache() -> Path:
    """ctxbuild's directory in the user's cache: $XDG_CACHE_HOME/ctxbuild, else ~/.cache/ctxbuild (the default
    home of the local cache, layout.cache_dir, and of provisioned toolchains, toolchain/provision.root)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():  # the XDG spec says to ignore a relative value
        return Path(xdg) / "ctxbuild"
    return Path.home() / ".cache" / "ctxbuild"
