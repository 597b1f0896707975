"""Shared fixtures: a private copy of the example recipes per test, and running the real CLI."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"

pytest_plugins = ["tests.nginx_fixture"]

# Copies of the example tree leave the LLM example out: tests/e2e/test_llm.py builds it; in every whole-tree
# build its 27 actions would double the time and change the counts those tests check.
EXAMPLES_IGNORE = shutil.ignore_patterns("models", "llm_*.yaml")


# Tests that run the real CLI or build the examples are end to end (marker `e2e`, run by `make test`;
# `pytest -m "not e2e"` leaves the fast unit tests). Files testing QNN in-process mark themselves.
E2E_FIXTURES = {"ctxbuild", "tree", "example_models"}


# The rest of the end-to-end suite (marker `full`, `make test-full`, run by CI after `make test`): farm, faults,
# caches across builds and machines, big models, bundles, LoRA, older toolchains. Chosen by measured time (the
# whole suite took 46 min on the 2-core machine under load, these files 34 of it) so that `make test` stays
# under 10 minutes; a test moves here by its file's name.
FULL_FILES = frozenset({
    "test_farm", "test_farm_netns", "test_safety", "test_big_model", "test_bundle", "test_faults", "test_llm_lora",
    "test_cache_build", "test_search", "test_fastpath", "test_never_stale", "test_lora", "test_reproducible",
    "test_external_data", "test_reapi", "test_cache_big_blobs", "test_quantized_io", "test_toolchains",
    "test_full_cache", "test_gate", "test_model_package", "test_old_toolchain_bundles", "test_llm_exporters",
    "test_search_mixed", "test_linked_weights", "test_user_paths", "test_input_values", "test_outputs_cut",
    "test_lora_alpha", "test_search_progress", "test_refusal_builds",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
        if item.path.stem in FULL_FILES:
            item.add_marker(pytest.mark.full)
    # Real-model tests take minutes: they run only when -m names them (`pytest -m slow`), whatever else
    # -m says (addopts' -m would be overridden by `make unit`'s own).
    if "slow" not in (config.getoption("markexpr") or ""):
        slow = [i for i in items if i.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [i for i in items if not i.get_closest_marker("slow")]


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


@pytest.fixture(scope="session")
def example_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example models and calibration samples, generated once per session by the project's script."""
    d = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, str(RECIPES / "models" / "make_models.py"), str(d)], check=True)
    return d


# The example CNN as a test recipe's first lines (the model as the example tree holds it, its input fixed).
TINY_CNN = "model: models/tiny_cnn.onnx\ninputs: {image: [1, 3, 64, 64]}\n"


def write_recipe(root: Path, name: str, body: str) -> Path:
    """A test's recipe: `root/<name>.yaml` holding `body`; the file returned."""
    root.mkdir(parents=True, exist_ok=True)
    f = root / f"{name}.yaml"
    f.write_text(body)
    return f


def copy_examples(dst: Path, example_models: Path) -> Path:
    """A writable copy of recipes/ (YAML files + generated models) at `dst`."""
    shutil.copytree(RECIPES, dst, ignore=EXAMPLES_IGNORE)
    shutil.copytree(example_models, dst / "models")
    return dst


@pytest.fixture
def tree(tmp_path: Path, example_models: Path) -> Path:
    """A writable copy of recipes/ (YAML files + generated models) under tmp_path/recipes."""
    return copy_examples(tmp_path / "recipes", example_models)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def ctxbuild(tmp_path: Path, cache_dir: Path):
    """Run `ctxbuild ARGS` as a user would; each test has its own local cache."""

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600) -> Result:
        return run_cli(args, cache_dir, cwd or tmp_path, env=env, timeout=timeout)

    return run


def run_cli(args: tuple[str, ...], cache_dir: Path, cwd: Path, *, env: dict[str, str] | None = None,
            timeout: float = 600) -> Result:
    """`ctxbuild ARGS` in a child process with `cache_dir` as its local cache."""
    full_env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache_dir), **(env or {})}
    full_env.pop("MAKEFLAGS", None)
    p = subprocess.run([sys.executable, "-m", "ctxbuild", *args], capture_output=True, text=True,
                       env=full_env, cwd=cwd, timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr)


def plan_only(paths: list[Path], out: Path, **options: Any) -> dict[str, Any]:
    """Plan into OUT as a build does (build.ninja, action specs, plan.json) and run nothing: what a dry run did
    before it wrote nothing. Point CTXBUILD_CACHE_DIR at the test's cache first (the plan cache lives there)."""
    from ctxbuild.engine.options import BuildOptions
    from ctxbuild.engine.fast.replan import ensure_planned

    return ensure_planned(BuildOptions(paths=paths, out=out.resolve(), **options))


def keep_only(tree: Path, *names: str) -> None:
    """Delete the example recipes of `tree` except `names` (directory defaults stay)."""
    for p in tree.glob("*.yaml"):
        if p.name not in (*names, "_defaults.yaml"):
            p.unlink()


def records(out: Path) -> dict[str, dict[str, Any]]:
    recs = {}
    for p in (out / ".ctxbuild" / "records").glob("*.json"):
        r = json.loads(p.read_text())
        recs[r["id"]] = r
    return recs


def llm_part_checks(d: Path) -> dict[str, dict[str, Any]]:
    """An LLM recipe's per-part verification results in its OUT/<target>/<recipe> directory, by file stem."""
    return {p.stem: json.loads(p.read_text()) for p in sorted((d / "llm_verify").glob("*.json"))}


def llm_logits(d: Path) -> list[dict[str, Any]]:
    """The last part's logits figures (cosine, snr_db, argmax_agreement: top-1 against the float tokens) per graph."""
    last = list(llm_part_checks(d).values())[-1]
    return [m for name, m in last["outputs"].items() if name.startswith("logits@")]


def cache_entries(*outs: Path) -> int:
    """Cache entries these builds made: one per action, plus the verify memo's (simulator and CPU reference
    outputs, stored under their own keys, which verify records list)."""
    recs = [r for out in outs for r in records(out).values()]
    return len({r["key"] for r in recs}) + len({k for r in recs for k in r.get("memo_keys", {}).values()})


def last_build(out: Path) -> dict[str, str]:
    """Action id -> what happened ("run", "cache", "failed") in the most recent `ctxbuild build`."""
    return json.loads((out / ".ctxbuild" / "last_build.json").read_text())["actions"]


def assert_pin_rebuilds_from_cache(ctxbuild, tree: Path, out: Path) -> None:
    """The search's answer pasted into the recipe (`pin`) builds the same QDQ model: a build into a new OUT restores
    its compile and verify from the cache."""
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    ran = last_build(out)
    assert {k.split("/")[0]: v for k, v in ran.items() if k.startswith(("compile/", "verify/"))} == {
        "compile": "cache", "verify": "cache"}, ran


@contextmanager
def small_tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs of `options` (e.g. size=48k) mounted on the existing directory `path` for the block; skips
    the test where mounting is not allowed (needs root)."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


def build_with_toolchains(tree: Path, out: Path, cache: Path, timeout: float = 1800) -> None:
    """`ctxbuild build TREE -o OUT` of recipes naming older toolchains (provisioned on demand, as a user's build
    does): skips the test where they cannot be provisioned (offline), fails it on any other error."""
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache)}
    env.pop("MAKEFLAGS", None)
    p = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(tree), "-o", str(out)],
                       capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0 and "cannot provision toolchain" in p.stderr:
        pytest.skip(f"an older toolchain cannot be provisioned here (offline?): {p.stderr[-300:]}")
    assert p.returncode == 0, p.stdout + p.stderr
