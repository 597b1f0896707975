"""Fast unit tests of the planner and the rendered build.ninja (a golden file): no onnxruntime, no QNN.

Regenerate the golden file after an intended change: CTXBUILD_UPDATE_GOLDEN=1 pytest tests/unit/test_plan_unit.py
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from ctxbuild.engine.ninjaquote import ninja_path
from ctxbuild.templating import template_dir
from ctxbuild.plan import kinds
from ctxbuild.engine import ninja
from ctxbuild.recipes import recipe
from ctxbuild.toolchain import installed as toolchain
from ctxbuild.plan.planner import Plan, make_plan
from ctxbuild.errors import RecipeError
from tests.fake_tree import fake_tree

GOLDEN = Path(__file__).parents[1] / "golden" / "build.ninja"


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    return make_plan(recipe.load([fake_tree(tmp_path / "recipes")]), tmp_path / "out")


def by_kind(plan: Plan) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in plan.actions:
        out.setdefault(a.kind, []).append(a.id)
    return {k: sorted(v) for k, v in out.items()}


def test_examples_plan_into_the_expected_actions(plan: Plan) -> None:
    got = {k: [i for i in v if "llm_tiny" not in i and "llm_lora" not in i] for k, v in by_kind(plan).items()}  # llm: tests/e2e/test_llm.py
    assert got["compile"] == sorted([
        "compile/tiny_cnn@SM8650", "compile/tiny_cnn@SM8750", "compile/tiny_cnn@SC8380XP",
        "compile/tiny_cnn_int8@SM8650", "compile/mlp_fp16@SM8650", "compile/mlp_fp16@SM8750",
        "compile/tiny_cnn_flex@SC8380XP+SM8750", "compile/tiny_cnn_flex.single@SC8380XP",
        "compile/lm_bundle.prefill@SM8650", "compile/lm_bundle.decode@SM8650",
        "compile/lm_bundle.prefill@SM8750", "compile/lm_bundle.decode@SM8750",
        "compile/lora_mlp@SM8650", "compile/lora_mlp@SM8750"])
    assert got["bundle"] == ["bundle/lm_bundle@SM8650", "bundle/lm_bundle@SM8750"]
    assert len(got["verify"]) == 13 and "prebuilt" not in got  # 8 direct, 4 bundle graphs, 1 multi-SoC
    # LoRA: 3 adapters x 2 targets, each bound and verified; the base compiled once per target.
    assert len(got["adapter"]) == len(got["verify_adapter"]) == 6
    # One model prepared the same way by three recipes is one action.
    tiny = [a for a in plan.actions if a.kind == "prepare" and "tiny_cnn" in a.id]
    assert len(tiny) == 1 and sorted(tiny[0].recipes) == ["tiny_cnn", "tiny_cnn_flex", "tiny_cnn_int8"]
    # int16 and int8 quantize it differently: two quantize actions over that one prepare.
    q = [a for a in plan.actions if a.kind == "quantize" and "tiny_cnn" in a.id]
    assert sorted(a.params["quantization"]["activations"] for a in q) == ["uint16", "uint8"]
    assert all(list(plan.graph.predecessors(a.id)) == [tiny[0].id] for a in q)


def test_every_action_matches_its_registered_kind(plan: Plan) -> None:
    for a in plan.actions:
        kind = kinds.get(a.kind)
        required, allowed = kind.params.__required_keys__, required_or_optional(kind.params)
        assert required <= set(a.params) <= allowed, (a.id, set(a.params) ^ allowed)
        assert a.id.startswith(f"{a.kind}/")
    with pytest.raises(KeyError, match="unknown action kind 'nope'"):
        kinds.get("nope")
    with pytest.raises(TypeError, match="registered twice"):
        type("Again", (kinds.Kind,), {"name": "compile"})


def test_edges_follow_files_and_order_is_topological(plan: Plan) -> None:
    seen: set[str] = set()
    for a in plan.actions:
        preds = set(plan.graph.predecessors(a.id))
        assert preds <= seen, a.id
        seen.add(a.id)
        for u in preds:  # an edge means: a reads a file u writes
            assert set(plan.graph.nodes[u]["action"].outputs.values()) & set(a.inputs.values()), (u, a.id)
    verify = plan.graph.nodes["verify/tiny_cnn_flex@SC8380XP+SM8750"]["action"]
    assert {"artifact.bin", "ctx.bin"} <= set(verify.inputs)  # the deliverable and its single-SoC twin
    flex = plan.graph.nodes["compile/tiny_cnn_flex@SC8380XP+SM8750"]["action"]
    assert flex.params["provider_options"]["soc_model"] == "60,69"


def test_artifacts_are_the_deliverables_outside_the_work_dir(plan: Plan) -> None:
    arts = plan.artifacts()
    assert {a["action"].split("/")[0] for a in arts} == kinds.names(deliverable=True) - {"prebuilt", "select",
                                                                                         "model_package"}
    assert not any(".ctxbuild" in a["path"] for a in arts)
    bundle = [a for a in arts if a["action"] == "bundle/lm_bundle@SM8650"]
    assert {a["role"] for a in bundle} == {"ctx:prefill", "ctx:decode", "bin"}
    assert bundle[0]["twins"] == ["compile/lm_bundle.decode@SM8650", "compile/lm_bundle.prefill@SM8650"]


def required_or_optional(td: type) -> set[str]:
    return set(td.__required_keys__) | set(td.__optional_keys__)


def _normalized(text: str, plan: Plan, tree: Path) -> str:
    """Machine-specific absolute paths -> placeholders, longest first (the venv lives inside the worktree);
    the short hashes in work-file names (they cover the model's absolute path) -> <hash>, and phony lists
    re-sorted after that (ninja sorts them by the hashed names)."""
    subs = {str(Path(sys.executable)): "$PYTHON", str(Path(ninja.__file__).resolve().parents[1]): "$PKG",
            str(template_dir()): "$TEMPLATES",
            str(toolchain.qnn_library_dir()): "$QNN", str(tree.resolve()): "$RECIPES", str(plan.out): "$OUT"}
    for old in sorted(subs, key=len, reverse=True):
        text = text.replace(ninja_path(old), subs[old]).replace(old, subs[old])
    text = re.sub(r"-[0-9a-f]{10}\b", "-<hash>", text)
    return "".join(_sorted_phony(line) for line in text.splitlines(keepends=True))


def _sorted_phony(line: str) -> str:
    head, sep, deps = line.rstrip("\n").partition(": phony ")
    return f"{head}{sep}{' '.join(sorted(deps.split()))}\n" if sep else line


def test_build_ninja_matches_the_golden_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = fake_tree(tmp_path / "recipes")
    plan = make_plan(recipe.load([tree]), tmp_path / "out")
    plan.out.mkdir()
    ninja.render(plan, compile_jobs=2, invocation={"paths": [str(tree)], "compile_jobs": 2, "verify": True})
    got = _normalized((plan.out / "build.ninja").read_text(), plan, tree)
    if os.environ.get("CTXBUILD_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), "build.ninja changed; if intended, regenerate (see this file's docstring)"


def test_fp16_verifies_on_the_calibration_samples(tmp_path: Path) -> None:
    """calibration.dir at fp16 (nothing to calibrate) is still the user's inputs: with no verify.dir the graph is
    verified on them, not on random data (which passed what the user's samples failed)."""
    from tests.conftest import keep_only

    tree = fake_tree(tmp_path / "recipes")
    keep_only(tree, "mlp_fp16.yaml")
    (tree / "mlp_fp16.yaml").write_text("model: models/mlp.onnx\nprecision: fp16\ncalibration: {dir: models/calib/mlp}\n")
    verifies = [a for a in make_plan(recipe.load([tree]), tmp_path / "out").actions if a.kind == "verify"]
    assert verifies and all(a.params["sample_source"] == "calibration" for a in verifies)
    assert all(a.watch == [str(tree / "models" / "calib" / "mlp")] for a in verifies)
    assert not [a for a in make_plan(recipe.load([tree]), tmp_path / "out").actions if a.kind == "quantize"]


def _packaged(tmp_path: Path, *names: str) -> tuple[Path, Path]:
    """The fake tree with only `names`, each with `package: true`."""
    from tests.conftest import keep_only

    tree = fake_tree(tmp_path / "recipes")
    keep_only(tree, *names)
    for name in names:
        (tree / name).write_text((tree / name).read_text() + "package: true\n")
    return tree, (tmp_path / "out").resolve()


def test_a_package_is_planned_over_every_variant(tmp_path: Path) -> None:
    """`package: true`: one package_variant per deliverable, after its verifications, and one model_package over
    them; a bundle's graphs are components whose variants name one directory."""
    tree, out = _packaged(tmp_path, "tiny_cnn.yaml", "lm_bundle.yaml")
    plan = make_plan(recipe.load([tree]), out)
    acts = {a.id: a for a in plan.actions}
    for a in acts.values():
        assert set(kinds.get(a.kind).params.__required_keys__) <= set(a.params) <= required_or_optional(
            kinds.get(a.kind).params), a.id
    tiny = acts["model_package/tiny_cnn"]
    assert [(v["component"], v["variant"]) for v in tiny.params["variants"]] == [
        ("tiny_cnn", "SM8650"), ("tiny_cnn", "SM8750"), ("tiny_cnn", "SC8380XP")]  # the recipe's target order
    assert tiny.outputs == {"package": str(out / "packages" / "tiny_cnn" / "manifest.json")}
    copy = acts["package_variant/tiny_cnn@SM8650"]
    d = out / "packages" / "tiny_cnn" / "SM8650"
    assert copy.outputs == {"ctx": str(d / "tiny_cnn_ctx.onnx"), "bin": str(d / "tiny_cnn_ctx_qnn.bin")}
    assert set(plan.graph.predecessors(copy.id)) == {"compile/tiny_cnn@SM8650", "verify/tiny_cnn@SM8650"}
    bundle = acts["model_package/lm_bundle"]
    assert [(v["component"], v["variant"], v["shares_context"]) for v in bundle.params["variants"]] == [
        ("prefill", "SM8650", True), ("decode", "SM8650", True),
        ("prefill", "SM8750", True), ("decode", "SM8750", True)]
    decode = bundle.params["variants"][1]
    assert [bundle.inputs[r] for r in decode["verified"]] == [acts["verify/lm_bundle.decode@SM8650"].outputs["result"]]
    assert bundle.inputs[decode["model"]] == str(out / "packages" / "lm_bundle" / "SM8650" / "decode_ctx.onnx")
    [row] = [a for a in plan.artifacts() if a["action"] == "model_package/tiny_cnn"]
    assert row["target"] is None and row["path"] == "packages/tiny_cnn/manifest.json"
    # --no-verify: packaged all the same, after nothing
    unverified = {a.id: a for a in make_plan(recipe.load([tree]), out, verify=False).actions}
    assert not [r for r in unverified["package_variant/tiny_cnn@SM8650"].inputs if r.startswith("verified:")]


@pytest.mark.parametrize("name, extra, says", [
    ("lora_mlp.yaml", "", "lora_mlp.yaml:21: package: a model package does not carry LoRA adapters (`adapters`) yet"),
    ("llm_tiny.yaml", "", "llm_tiny.yaml:14: `package` does not apply to an `llm:` recipe"),
    ("tiny_cnn.yaml", "targets: [{name: packages, soc_model: 57, htp_arch: 75}]\n",
     "custom target name 'packages' is one of OUT's own files or directories"),
])
def test_what_a_package_cannot_hold_is_a_recipe_error(tmp_path: Path, name: str, extra: str, says: str) -> None:
    tree, _ = _packaged(tmp_path, name)
    (tree / name).write_text((tree / name).read_text().replace("targets:", "#targets:") + extra if extra
                             else (tree / name).read_text())
    with pytest.raises(RecipeError) as e:
        recipe.load([tree])
    assert says in e.value.message, e.value.message


def test_a_default_package_leaves_llm_recipes_out(tmp_path: Path) -> None:
    """`package: true` in _defaults.yaml packages what it can: an llm: recipe runs from its genai_config.json."""
    from tests.conftest import keep_only

    tree = fake_tree(tmp_path / "recipes")
    keep_only(tree, "tiny_cnn.yaml", "llm_tiny.yaml")
    (tree / "_defaults.yaml").write_text((tree / "_defaults.yaml").read_text().replace("defaults:\n",
                                                                                       "defaults:\n  package: true\n"))
    plan = make_plan(recipe.load([tree]), tmp_path / "out")
    assert {a.id for a in plan.actions if a.kind == "model_package"} == {"model_package/tiny_cnn"}
