"""Provisioned toolchains: one directory per toolchain under the user's cache, made on demand, reused after.

`<toolchains>/onnxruntime-qnn-2.3.0/site` holds exactly the pinned onnxruntime and onnxruntime-qnn wheels
(`pip install --no-deps --target`); everything else (onnx, numpy, ctxbuild itself) comes from the environment
ctxbuild runs in. A process runs in a toolchain with the site first on its path (PYTHONPATH): its
onnxruntime and QNN libraries shadow the installed ones, and the one ctxbuild codebase runs in every
toolchain. `toolchain.json` is written last, after a child process imported the toolchain and read the QAIRT
its wheel ships: a directory without it is unfinished and is made again. Offline: provision ahead
(`ctxbuild toolchain provision`), or point $CTXBUILD_WHEELHOUSE at a directory of the wheels (pip --no-index).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ctxbuild import settings
from ctxbuild.atomic import write_bytes
from ctxbuild.errors import cause_line, UsageError
from ctxbuild.procs import die_with_parent
from ctxbuild.toolchain.choose import Toolchain, by_name
from ctxbuild.toolchain.pipprogress import megabytes, run_pip

MARKER = "toolchain.json"

# Run with the toolchain's site first on the path: what it really imports, and the QAIRT its wheel ships.
_CHECK = """
import json, onnxruntime, onnxruntime_qnn
from onnxruntime_qnn import build_and_package_info as info
print(json.dumps({"onnxruntime": onnxruntime.__version__, "onnxruntime-qnn": info.__version__,
                  "qairt": info.qnn_version, "files": [onnxruntime.__file__, onnxruntime_qnn.__file__]}))
"""


def root() -> Path:
    """$CTXBUILD_TOOLCHAINS_DIR, else `toolchains` in the user cache. Not under $CTXBUILD_CACHE_DIR: the
    artifact cache is cleared and moved more freely than ~0.5 GB of environments."""
    if explicit := settings.TOOLCHAINS_DIR.get():  # absolute: it goes on PYTHONPATH, actions chdir
        return Path(explicit).expanduser().absolute()
    return settings.user_cache() / "toolchains"


def site(tc: Toolchain) -> Path:
    return root() / tc.name / "site"


def provisioned(tc: Toolchain) -> dict[str, Any] | None:
    """What the finished toolchain recorded (versions, QAIRT), or None if it is missing, unfinished or damaged."""
    info = _marker(tc)
    return info if info is not None and info.get("pins") == tc.pins and not damage(tc, info) else None


def damage(tc: Toolchain, info: dict[str, Any]) -> str | None:
    """What is wrong with a finished toolchain's files (a stat per file against what provisioning recorded: a
    deleted or truncated library), or None."""
    files = info.get("files")
    if not isinstance(files, dict):
        return "it records no file list (made by an older ctxbuild)"
    home = site(tc)
    for rel, size in files.items():
        try:
            if (home / rel).stat().st_size != size:
                return f"{rel} has changed size"
        except OSError:
            return f"{rel} is missing"
    return None


def _marker(tc: Toolchain) -> dict[str, Any] | None:
    try:
        return json.loads((root() / tc.name / MARKER).read_text())
    except (OSError, ValueError):
        return None


def env_for(tc: Toolchain | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment that runs Python in `tc` (None: the installed toolchain, unchanged)."""
    env = dict(os.environ if base is None else base)
    if tc is not None:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(site(tc))]
        env["PYTHONPATH"] = os.pathsep.join([str(site(tc)), *rest])
    return env


def active(tc: Toolchain) -> bool:
    """This process runs in `tc` (its site is on the path)."""
    return str(site(tc)) in sys.path


def ensure(tc: Toolchain, say: Callable[[str], None], *, revalidate: bool = False,
           live: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Provision `tc` unless it is there (and intact); one process at a time (a lock per toolchain). `revalidate`
    (`ctxbuild toolchain provision`): also import it in a child and provision it again if that fails. UsageError
    when pip cannot get the wheels (offline without a wheelhouse), with what to do. `say`: lasting lines
    (progress every few seconds off a terminal); `live`: a terminal's status line, rewritten in place."""
    if (info := provisioned(tc)) is not None:
        if not revalidate:
            return info
        try:
            check(tc)
            return info
        except UsageError as e:
            say(f"ctxbuild: toolchain {tc.label} in {root() / tc.name} fails its check ({e.message}): provisioning "
                "it again")
            (root() / tc.name / MARKER).unlink(missing_ok=True)
    root().mkdir(parents=True, exist_ok=True)
    if (marker := _marker(tc)) and (why := damage(tc, marker)):
        say(f"ctxbuild: toolchain {tc.label} in {root() / tc.name} is damaged ({why}): provisioning it again")
    with open(root() / f".{tc.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (info := provisioned(tc)) is not None:  # another build made it while we waited
            return info
        say(f"ctxbuild: provisioning toolchain {tc.label} into {root() / tc.name} (once: {' and '.join(tc.pins)} "
            "from PyPI)")
        started = time.monotonic()
        info = _provision(tc, say, live)
        size = sum(f.stat().st_size for f in (root() / tc.name).rglob("*") if f.is_file())
        say(f"ctxbuild: toolchain {tc.name} provisioned in {time.monotonic() - started:.0f} s ({megabytes(size)})")
        return info


def _provision(tc: Toolchain, say: Callable[[str], None], live: Callable[[str], None] | None) -> dict[str, Any]:
    home = root() / tc.name
    shutil.rmtree(home, ignore_errors=True)  # an unfinished attempt
    tmp = home / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
           "--target", str(tmp), *tc.pins]
    if wheelhouse := settings.WHEELHOUSE.get():
        cmd += ["--no-index", "--find-links", wheelhouse]
    # pip dies with this process (a kill -9 of the build included): no orphan keeps writing into the directory
    p = run_pip(cmd, len(tc.pins), say, live, preexec_fn=die_with_parent)
    if p.returncode != 0:
        tail = cause_line(" ".join(p.stderr.strip().splitlines()[-2:]), limit=400)
        raise UsageError(f"cannot provision toolchain {tc.label}: pip failed: {tail}",
                         f"check the network or proxy, or set ${settings.WHEELHOUSE.name} to a directory holding "
                         f"{' and '.join(tc.pins)} wheels, or run `ctxbuild toolchain provision {tc.plugin}` where "
                         "PyPI is reachable and copy the toolchains directory")
    say(f"ctxbuild: toolchain: checking that {tc.name} imports and ships QAIRT {tc.qairt}")
    info = check(tc)
    files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
    write_bytes(home / MARKER, json.dumps({**info, "pins": tc.pins, "files": files}, indent=1,
                                          sort_keys=True).encode())
    return provisioned(tc) or {}


def check(tc: Toolchain) -> dict[str, Any]:
    """Import the toolchain in a child process: it must be the pinned versions, from its own site, shipping
    the QAIRT the release table says."""
    p = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, env=env_for(tc), timeout=300)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = cause_line(p.stderr, last=True)
        raise UsageError(f"toolchain {tc.label} does not import: {tail}", f"remove {root() / tc.name} and build again")
    got = json.loads(lines[-1])
    wrong = [f"{k} {got[k]} (want {want})" for k, want in (("onnxruntime", tc.onnxruntime),
             ("onnxruntime-qnn", tc.plugin), ("qairt", tc.qairt)) if got[k] != want]
    wrong += [f"{f} outside the toolchain" for f in got["files"] if not Path(f).is_relative_to(site(tc))]
    if wrong:
        raise UsageError(f"toolchain {tc.name} is not what it was pinned to: {'; '.join(wrong)}",
                         f"remove {root() / tc.name} and build again")
    return {k: got[k] for k in ("onnxruntime", "onnxruntime-qnn", "qairt")}


def listing() -> list[dict[str, Any]]:
    """The provisioned toolchains: name, versions, size on disk; `unfinished` or `damaged` (why) if so."""
    rows = []
    for home in sorted(root().glob("onnxruntime-qnn-*")):
        try:
            info = json.loads((home / MARKER).read_text())
        except (OSError, ValueError):
            info = {"unfinished": True}
        else:
            if why := damage(by_name(home.name), info):
                info["damaged"] = why
            info.pop("files", None)
        size = sum(f.stat().st_size for f in home.rglob("*") if f.is_file() and not f.is_symlink())
        rows.append({"name": home.name, "path": str(home), "bytes": size, **info})
    return rows
