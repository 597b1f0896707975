"""Where things live under OUT. Kept import-light: every action process and the no-op path use it."""
from __future__ import annotations

from pathlib import Path

from ctxbuild import settings

STATE = ".ctxbuild"  # OUT/.ctxbuild: action specs, records, logs, depfiles, work files, plan state
OUT_FILES = ("build.ninja", "manifest.json", "report.json", "report.html")  # besides the artifacts and STATE
PACKAGES = "packages"  # OUT/packages/<recipe>/: onnxruntime model packages (`package: true`), beside OUT/<target>/


def package_dir(out: Path, name: str) -> Path:
    return out / PACKAGES / name


def spec_name(action_id: str) -> str:
    return action_id.replace("/", ".") + ".json"


def record_path(out: Path, action_id: str) -> Path:
    return out / STATE / "records" / spec_name(action_id)


def log_path(out: Path, action_id: str) -> Path:
    return out / STATE / "logs" / (spec_name(action_id)[:-5] + ".log")


def depfile_path(out: Path, action_id: str) -> Path:
    return out / STATE / "deps" / (spec_name(action_id) + ".d")


def rel(p: str, out: Path) -> str:
    """A path as build.ninja names it: relative to OUT when inside it (ninja runs there), else absolute."""
    path = Path(p)
    try:
        return str(path.relative_to(out))
    except ValueError:
        return str(path)


def memo_dir(name: str) -> Path:
    """Derived facts kept in the user cache beside the action cache (plans, discovered inputs, binaries'
    SoCs, compiled templates): each a pure function of what names it, so deleting any of them is safe.
    A symbolic link planted for either directory is removed, never followed (a memo written through it
    would land outside the cache)."""
    path = cache_dir() / "memo" / name
    for d in (path.parent, path):
        if d.is_symlink():
            d.unlink(missing_ok=True)
    return path


def cache_dir() -> Path:
    """The local cache: $CTXBUILD_CACHE_DIR, else $XDG_CACHE_HOME/ctxbuild, else ~/.cache/ctxbuild."""
    explicit = settings.CACHE_DIR.get()
    return Path(explicit).expanduser() if explicit else settings.user_cache()


def layers_path(verify_result: str) -> Path:
    """`ctxbuild verify --layers` writes `<graph>_layers.json` beside the graph's `_verify.json`."""
    p = Path(verify_result)
    return p.with_name(p.name.removesuffix("_verify.json") + "_layers.json")
