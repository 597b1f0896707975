"""Fuzz tests (issue 46): random recipes and defaults files through the loader and the planner, random CTXBUILD_*
values through the settings check and the CLI. Every case ends in a plan or a CtxbuildError (one line, exit 2 from
the CLI), never another exception, and nothing is written outside OUT and the cache. A few hundred cases run in the
normal suite; `pytest -m slow tests/e2e/test_fuzz.py` runs 10,000 of each of the in-process ones."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from ctxbuild import settings
from ctxbuild.errors import CtxbuildError, UsageError
from ctxbuild.recipes.recipe import schema

NORMAL, SLOW = 200, 10_000


def _keys(node: Any) -> set[str]:
    """Every property name anywhere in the recipe schema: fields the loader has code for."""
    found: set[str] = set()
    if isinstance(node, dict):
        found |= set(node.get("properties", {}))
        for v in node.values():
            found |= _keys(v)
    elif isinstance(node, list):
        for v in node:
            found |= _keys(v)
    return found


KEYS = sorted(_keys(schema()))
WORDS = ["models/mlp.onnx", "models/tiny_cnn.onnx", "models", "models/calib/mlp", "../outside", "/etc/passwd",
         "/dev/zero", "SM8650", "SM8750", "phones", "X-Elite", "fp16", "int8", "int16", "auto", "qdq", "uint16", "w4a16",
         "installed", "2.47", "*", "x", "", "1e400", "-1", "0", "nan", "~", "&a", "*a", "!!python/object:os.system",
         "é", "a\tb", "a\nb", "{bad", "x:y", "http://u:p@host/", "sha256-00"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(WORDS))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=5)), max_leaves=16)
PATHS = ["models/mlp.onnx", "models/tiny_cnn.onnx", "models/calib/mlp", "models/calib/tiny_cnn", "models",
         "models/lm_prefill.onnx", "models/llama_tiny.onnx", "models/prompts/llama_tiny", "../outside", "/etc/passwd"]


def _from_schema(node: Any, defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that mostly follow the recipe schema (enums, bounds, known properties), so that cases get past the
    schema into the loader's own checks and the planner; now and then anything at all (VALUES)."""
    if "$ref" in node:
        return st.deferred(lambda: _from_schema(defs[node["$ref"].rsplit("/", 1)[1]], defs, depth + 1))
    if depth > 6:
        return SCALARS
    options: list[st.SearchStrategy[Any]] = []
    for key in ("oneOf", "anyOf"):
        options += [_from_schema(n, defs, depth + 1) for n in node.get(key, [])]
    if "enum" in node:
        options.append(st.sampled_from(node["enum"]))
    if "const" in node:
        options.append(st.just(node["const"]))
    kinds = node.get("type", [])
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        lo, hi = node.get("minimum", -5), node.get("maximum", 5000)
        options.append({
            "object": lambda: st.fixed_dictionaries({}, optional={
                k: _from_schema(v, defs, depth + 1) for k, v in node.get("properties", {}).items()}) if
            node.get("properties") else st.dictionaries(st.sampled_from(["a", "image", "x", "SM8650", "n"]),
                                                        _from_schema(node.get("additionalProperties") or {}, defs,
                                                                     depth + 1) if isinstance(
                                                            node.get("additionalProperties"), dict) else SCALARS,
                                                        max_size=3),
            "array": lambda: st.lists(_from_schema(node.get("items", {}), defs, depth + 1), max_size=3),
            "string": lambda: st.sampled_from(WORDS + PATHS),
            "integer": lambda: st.integers(int(lo) - 1, int(hi) + 1),
            "number": lambda: st.one_of(st.floats(lo - 1, hi + 1), st.sampled_from([0.0, -1.0, 1e9])),
            "boolean": st.booleans,
            "null": st.none,
        }.get(kind, lambda: SCALARS)())
    return st.one_of(*options * 3, VALUES) if options else VALUES  # anything at all a quarter of the time


RECIPE_SCHEMA = schema()
VALID = [  # the examples' recipes that plan, each case one of them with up to 3 fields drawn over it
    {"model": "models/mlp.onnx", "precision": "fp16", "targets": ["SM8650"]},
    {"model": "models/tiny_cnn.onnx", "inputs": {"image": [1, 3, 64, 64]}, "precision": "int8",
     "calibration": {"dir": "models/calib/tiny_cnn"}, "targets": ["SM8650", "SM8750"]},
    {"model": "models/mlp.onnx", "precision": "int16", "calibration": {"dir": "models/calib/mlp"}, "targets": ["SM8650"],
     "verify": {"dir": "models/calib/mlp", "samples": 2}},
    {"model": "models/lm_prefill.onnx", "precision": "fp16", "targets": ["SM8750"], "package": True}]
FIELDS = {k: _from_schema(v, RECIPE_SCHEMA["$defs"]) for k, v in RECIPE_SCHEMA["properties"].items()}
SHAPED = st.tuples(
    st.sampled_from(VALID),
    st.lists(st.sampled_from(sorted(FIELDS)), max_size=3, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: FIELDS[k] for k in keys}))).map(lambda t: {**t[0], **t[1]})
RECIPES = st.one_of(
    SHAPED, SHAPED, SHAPED, SHAPED,  # mostly within the schema: the loader's and the planner's own checks
    st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6),
    VALUES)
DEFAULTS = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
    "defaults": st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4),
    "target_groups": st.dictionaries(st.text(max_size=6), VALUES, max_size=3),
    "cache": VALUES, "executor": VALUES}))
RAW = st.text(max_size=200)  # text that may not even be YAML


def _dump(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, ValueError):
        return json.dumps(doc, default=str)


def _listing(root: Path, *skip: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if not any(p.is_relative_to(s) for s in skip) and not p.is_symlink()}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(example_models, root / "recipes" / "models")
    return root


def _load_and_plan(project: Path, text: str, defaults: str | None) -> None:
    """recipe.load, then make_plan on what loads: a plan or a CtxbuildError, nothing written but the cache's memos."""
    from ctxbuild.plan.planner import make_plan
    from ctxbuild.recipes import recipe

    d = project / "recipes"
    (d / "x.yaml").write_text(text)
    if defaults is None:
        (d / "_defaults.yaml").unlink(missing_ok=True)
    else:
        (d / "_defaults.yaml").write_text(defaults)
    before = _listing(project, project / "cache", d / "x.yaml", d / "_defaults.yaml")
    try:
        make_plan(recipe.load([d]), project / "out")
    except CtxbuildError as e:
        assert str(e).strip() and "\n" not in str(e).strip(), str(e)
    after = _listing(project, project / "cache", d / "x.yaml", d / "_defaults.yaml")
    assert after == before, sorted(set(after) ^ set(before))


def _recipe_case(project: Path, data: st.DataObject) -> None:
    text = data.draw(st.one_of(RECIPES.map(_dump), RECIPES.map(_dump), RECIPES.map(_dump), RAW), label="recipe")
    defaults = data.draw(st.one_of(st.none(), st.none(), st.none(), DEFAULTS.map(_dump), RAW), label="_defaults.yaml")
    _load_and_plan(project, text, defaults)


COMMON = dict(deadline=None, database=None, derandomize=True,  # no .hypothesis/ written; the same cases every run
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                     HealthCheck.data_too_large])


@pytest.fixture
def cache_env(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.CACHE_DIR.name, str(project / "cache"))


@hsettings(max_examples=NORMAL, **COMMON)
@given(data=st.data())
def test_random_recipes_load_or_are_refused(project: Path, cache_env: None, data: st.DataObject) -> None:
    _recipe_case(project, data)


@pytest.mark.slow
@hsettings(max_examples=SLOW, **COMMON)
@given(data=st.data())
def test_random_recipes_load_or_are_refused_10000(project: Path, cache_env: None, data: st.DataObject) -> None:
    _recipe_case(project, data)


ENV_VALUES = st.one_of(st.text(max_size=16).filter(lambda v: "\x00" not in v),
                       st.sampled_from(["inf", "-inf", "nan", "0", "-0", "-1", "1e400", "0.0", "1", "2", "4", "5",
                                        str(2 ** 64), "{}", "[]", "{bad", '{"qnn_sdk": "v0"}', "null", "local", "fail",
                                        " 3 ", "1_000", "0x10", "", "true"]))
SETTINGS_ENV = st.dictionaries(st.sampled_from([s.name for s in settings.ALL]), ENV_VALUES, max_size=6)


def _settings_case(env: dict[str, str]) -> None:
    """check_all refuses with one UsageError naming a variable, or every setting then reads without error."""
    try:
        settings.check_all(env)
    except UsageError as e:
        assert str(e).split("=", 1)[0] in env and "\n" not in str(e), str(e)
        return
    for s in settings.ALL:
        s.get(env)


@hsettings(max_examples=NORMAL, **COMMON)
@given(env=SETTINGS_ENV)
def test_random_settings_are_checked_at_start(env: dict[str, str]) -> None:
    _settings_case(env)


@pytest.mark.slow
@hsettings(max_examples=SLOW, **COMMON)
@given(env=SETTINGS_ENV)
def test_random_settings_are_checked_at_start_10000(env: dict[str, str]) -> None:
    _settings_case(env)


# The CLI end to end with random settings (a process each: a few cases), the recipes the examples' mlp_fp16.
CLI_CASES = [{"CTXBUILD_REMOTE_TIMEOUT": "nan"}, {"CTXBUILD_ORT_LOG_LEVEL": " 3 "}, {"CTXBUILD_VERIFY_WORKERS": "-2"},
             {"CTXBUILD_TOOLCHAIN_OVERRIDE": "null", "CTXBUILD_REMOTE_MAX_DOWNLOAD": "0x10"},
             {"CTXBUILD_CACHE_LINK": "maybe", "CTXBUILD_VERIFY_MEMO": "é", "CTXBUILD_MEMORY_BUDGET": "lots"}]


@pytest.mark.parametrize("env", CLI_CASES, ids=lambda e: ",".join(f"{k[9:]}={v}" for k, v in e.items()))
def test_random_settings_through_the_cli(tmp_path: Path, example_models: Path, env: dict[str, str]) -> None:
    (tmp_path / "recipes").mkdir()
    shutil.copytree(example_models, tmp_path / "recipes" / "models")
    (tmp_path / "recipes" / "m.yaml").write_text("model: models/mlp.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    before = _listing(tmp_path)
    full = {**os.environ, "CTXBUILD_CACHE_DIR": str(tmp_path / "cache"), **env}
    full.pop("MAKEFLAGS", None)
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", "recipes", "-o", "out", "--dry-run"],
                       capture_output=True, text=True, env=full, cwd=tmp_path, timeout=120)
    assert "Traceback" not in p.stderr and p.returncode in (0, 2), p.stdout + p.stderr
    if p.returncode == 2:
        assert p.stderr.count("\n") == 1 and any(k in p.stderr for k in env), p.stderr
    wrote = {f for f in set(_listing(tmp_path)) - set(before)
             if not Path(f).is_relative_to(tmp_path / "cache") and not Path(f).is_relative_to(tmp_path / "out")}
    assert not wrote, sorted(wrote)


def test_a_line_break_in_a_key_stays_one_line(project: Path, cache_env: None) -> None:
    """What the 10,000-case run found first: `"\\n": 0` at the top level made a two-line error."""
    _load_and_plan(project, '{"model": "models/mlp.onnx", "precision": "fp16", "targets": ["SM8650"], "\\n": 0}', None)
    with pytest.raises(CtxbuildError, match=r"unknown key '\\n'"):
        from ctxbuild.recipes import recipe

        recipe.load([project / "recipes"])
