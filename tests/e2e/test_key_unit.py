"""Fast unit tests of the action key (plan/key.py): what changes it and what must not.
No onnxruntime, no QNN: the QNN SDK build id (a probe compile) is replaced by a fixed string."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ctxbuild.plan import actionkey as keys
from ctxbuild.toolchain import installed as toolchain
from ctxbuild.plan.action import Action
from ctxbuild.digests import DigestMemo


@pytest.fixture(autouse=True)
def fixed_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "sdk_build_id", lambda out_state, toolchain=None: "v2.51.0.test")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


def compile_action(d: Path, *, soc: str = "57", vtcm: str = "8", content: bytes = b"model bytes") -> Action:
    d.mkdir(parents=True, exist_ok=True)
    model = d / "quantized.onnx"
    if not model.exists():
        model.write_bytes(content)
    return Action(id="compile/m@X", kind="compile", description="compile m@X", inputs={"model": str(model)},
                  outputs={"ctx": str(d / "out" / "m_ctx.onnx"), "bin": str(d / "out" / "m_ctx_qnn.bin")},
                  params={"provider_options": {"soc_model": soc, "htp_arch": "75", "vtcm_mb": vtcm}, "embed": False,
                          "cpu_fallback": False, "precision": "int16", "graphs": ["m"]})


def key(action: Action, state: Path) -> tuple[str, dict]:
    components = keys.components(action, {}, DigestMemo(None), state)
    return keys.digest(components), components


def test_same_content_elsewhere_is_the_same_key(tmp_path: Path) -> None:
    a, _ = key(compile_action(tmp_path / "one"), tmp_path / "one" / ".ctxbuild")
    b, _ = key(compile_action(tmp_path / "two" / "deeper"), tmp_path / "two" / ".ctxbuild")
    assert a == b  # no OUT path, no input path, no time in the key


def test_touching_an_input_keeps_the_key_editing_it_changes_it(tmp_path: Path) -> None:
    action = compile_action(tmp_path)
    before, old = key(action, tmp_path)
    os.utime(action.inputs["model"], (1, 1))
    assert key(action, tmp_path)[0] == before
    Path(action.inputs["model"]).write_bytes(b"other model bytes")
    after, new = key(action, tmp_path)
    assert after != before
    assert keys.why({"key_detail": old}, {"key_detail": new}) == "changed: inputs (model)"


def test_a_parameter_changes_the_key_and_why_names_it(tmp_path: Path) -> None:
    k8, old = key(compile_action(tmp_path / "a", vtcm="8"), tmp_path)
    k4, new = key(compile_action(tmp_path / "b", vtcm="4"), tmp_path)
    assert k8 != k4
    assert keys.why({"key_detail": old}, {"key_detail": new}) == "changed: params (provider_options.vtcm_mb)"


def test_qnn_version_keys_qnn_kinds_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare = Action(id="prepare/m", kind="prepare", description="prepare m",
                     inputs={"model": compile_action(tmp_path).inputs["model"]}, outputs={"model": str(tmp_path / "p.onnx")},
                     params={"inputs": {"x": [1, 4]}, "optimize": True})
    compile = compile_action(tmp_path)
    before = key(prepare, tmp_path)[0], key(compile, tmp_path)[0]
    real = toolchain.version
    monkeypatch.setattr(toolchain, "version", lambda d, site=None: "9.9.9" if d == "onnxruntime-qnn" else real(d, site))
    after = key(prepare, tmp_path)[0], key(compile, tmp_path)[0]
    assert after[0] == before[0] and after[1] != before[1]
    assert "onnxruntime-qnn" not in key(prepare, tmp_path)[1]["toolchain"]


def test_multi_soc_compiles_key_the_reproducible_build_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    single, flex = compile_action(tmp_path), compile_action(tmp_path, soc="60,69")
    assert "extras" not in key(single, tmp_path)[1]
    assert key(flex, tmp_path)[1]["extras"] == {"build_time": "1970-01-01 00:00:00 UTC"}
    before = key(single, tmp_path)[0], key(flex, tmp_path)[0]
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    after = key(single, tmp_path)[0], key(flex, tmp_path)[0]
    assert after[0] == before[0] and after[1] != before[1]


def test_prepare_keys_the_legalization_rules_code(tmp_path: Path, example_models: Path) -> None:
    """A rule added or edited changes prepare's spec and key (no ACTION_SCHEMA_VERSION bump needed) and
    re-plans (the rules are generator inputs: ninja re-runs the prepare in an existing OUT, which it did not when
    the digest was computed only at run time); `rewrite: false` prepares do not depend on the rules."""
    import shutil

    from ctxbuild.digests import source_digest
    from ctxbuild.engine.ninja import _planner_files
    from ctxbuild.graph import LEGALIZE_DIR
    from ctxbuild.plan.steps import prepare_action
    from ctxbuild.recipes.recipe import load

    rules = tmp_path / "legalize"
    shutil.copytree(LEGALIZE_DIR, rules, ignore=shutil.ignore_patterns("__pycache__"))
    before = source_digest(rules)
    assert before == source_digest(LEGALIZE_DIR)
    edited = tmp_path / "edited"
    shutil.copytree(rules, edited)
    (edited / "clip.py").write_text((edited / "clip.py").read_text() + "\n# changed\n")
    added = tmp_path / "added"
    shutil.copytree(rules, added)
    (added / "new_rule.py").write_text('"""a new rule"""\n')
    assert len({before, source_digest(edited), source_digest(added)}) == 3
    assert set(LEGALIZE_DIR.glob("*.py")) <= set(_planner_files())

    (tmp_path / "r.yaml").write_text("model: m.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    shutil.copy(example_models / "mlp.onnx", tmp_path / "m.onnx")
    recipe = load([tmp_path / "r.yaml"]).recipes[0]
    _, prepare = prepare_action(recipe, recipe.graphs[0], tmp_path / "work")
    assert prepare.params["legalize_code"] == before
    recipe.rewrite = False
    _, plain = prepare_action(recipe, recipe.graphs[0], tmp_path / "work")
    assert "legalize_code" not in plain.params
