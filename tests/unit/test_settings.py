"""CTXBUILD_* variables are read in ctxbuild/settings.py only, each documented once, and read as typed values."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ctxbuild import settings
from ctxbuild.engine.run import client

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"CTXBUILD_[A-Z0-9_]*[A-Z0-9]")


def _spelled_out(path: Path) -> list[str]:
    """Variable names written as whole string literals, other than as the key of an assignment
    (`env["CTXBUILD_NO_CACHE"] = "1"` writes one for a child process; every read goes through settings)."""
    tree = ast.parse(path.read_text())
    written = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)}
    return [f"{path.relative_to(ROOT)}:{n.lineno}: {n.value}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value)
            and id(n) not in written]


def test_only_settings_names_the_variables() -> None:
    exempt = {ROOT / "ctxbuild" / "settings.py", Path(client.__file__)}  # client.py: see test below
    found = [hit for p in sorted((ROOT / "ctxbuild").rglob("*.py")) if p not in exempt for hit in _spelled_out(p)]
    assert not found, "read these through ctxbuild/settings.py:\n" + "\n".join(found)


def test_the_client_spells_the_worker_variable_as_settings_does() -> None:
    assert client.ENV == settings.WORKER.name  # it cannot import settings: it runs without site-packages


def test_every_setting_is_documented_and_every_documented_one_exists() -> None:
    assert set(settings.ALL) == {v for v in vars(settings).values() if isinstance(v, settings.Setting)}
    names = {s.name for s in settings.ALL}
    assert len(names) == len(settings.ALL)
    table = (ROOT / "docs" / "outputs-and-cli.md").read_text().split("### Environment variables", 1)[1]
    listed = set(re.findall(r"^\| `(CTXBUILD_\w+)` \|", table, re.M))
    assert listed == names
    mentioned = {m for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] for m in NAME.findall(p.read_text())}
    unknown = {m for m in mentioned - names if not m.startswith(settings.WORKER.name + "_")}
    assert not unknown, f"docs name variables ctxbuild does not read: {sorted(unknown)}"


def test_values_are_typed_and_defaults_apply() -> None:
    assert settings.REMOTE_TIMEOUT.get({}) == 10.0
    assert settings.REMOTE_TIMEOUT.get({"CTXBUILD_REMOTE_TIMEOUT": "2.5"}) == 2.5
    assert settings.REMOTE_MAX_DOWNLOAD.get({"CTXBUILD_REMOTE_MAX_DOWNLOAD": "1000"}) == 1000
    assert settings.NO_CACHE.get({"CTXBUILD_NO_CACHE": "1"}) is True
    assert settings.NO_CACHE.get({"CTXBUILD_NO_CACHE": "0"}) is False
    assert settings.VERIFY_MEMO.get({}) is True and settings.VERIFY_MEMO.get({"CTXBUILD_VERIFY_MEMO": "0"}) is False
    assert settings.REMOTE_CACHE.get({"CTXBUILD_REMOTE_CACHE": ""}) is None  # set but empty: unset
    assert settings.MEMORY_BUDGET.get({"CTXBUILD_MEMORY_BUDGET": "lots"}) is None  # set by the driver: lenient
    assert settings.remote_token({"CTXBUILD_REMOTE_TOKEN_ENV": "MY_TOKEN", "MY_TOKEN": "t0k"}) == "t0k"
    with pytest.raises(ValueError, match=r"CTXBUILD_REMOTE_TIMEOUT='soon': expected a number"):
        settings.REMOTE_TIMEOUT.get({"CTXBUILD_REMOTE_TIMEOUT": "soon"})


def test_values_are_read_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The driver sets variables for its own later reads: nothing is read once at import."""
    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path / "a"))
    from ctxbuild.layout import cache_dir

    assert cache_dir() == tmp_path / "a"
    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path / "b"))
    assert cache_dir() == tmp_path / "b"


def test_every_setting_takes_its_default_and_good_values() -> None:
    settings.check_all({})
    settings.check_all({"CTXBUILD_REMOTE_TIMEOUT": "0.5", "CTXBUILD_ORT_LOG_LEVEL": "4", "CTXBUILD_VERIFY_WORKERS": "2",
                        "CTXBUILD_TOOLCHAIN_OVERRIDE": '{"qnn_sdk": "v0"}', "CTXBUILD_EXECUTOR_FALLBACK": "local"})
    assert settings.TOOLCHAIN_OVERRIDE.get({"CTXBUILD_TOOLCHAIN_OVERRIDE": '{"qnn_sdk": "v0"}'}) == {"qnn_sdk": "v0"}


def test_a_misspelt_variable_is_named_with_the_settings_it_is_close_to(ctxbuild, tmp_path: Path) -> None:
    """CTXBUILD_CACHE (for CTXBUILD_CACHE_DIR) was ignored in silence and the build filled the default cache."""
    assert settings.check_all({"CTXBUILD_CACHE_DIR": "/x", "CTXBUILD_WORKER_onnxruntime_qnn_2_3_0": "s",
                               "CTXBUILD_UPDATE_GOLDEN": "1"}) == []  # settings, workers' sockets, far from any
    [warning] = settings.check_all({"CTXBUILD_CACHE": "/x"})
    assert warning.startswith("CTXBUILD_CACHE is not a ctxbuild setting and is ignored: did you mean ") and \
        "CTXBUILD_CACHE_DIR" in warning, warning
    r = ctxbuild("build", "--dry-run", str(tmp_path), env={"CTXBUILD_CACHE": str(tmp_path / "c")})
    assert f"ctxbuild: warning: {warning}" in r.err.splitlines(), r.err
