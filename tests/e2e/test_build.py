"""End to end through the real EP: a multi-target build, loadable outputs, the simulator, ninja no-ops."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import Result, copy_examples, last_build, run_cli
from tests._qnn_models import cosine, cpu_run, qnn_session


@dataclass
class Shared:
    """One cold build of the examples: its tree, OUT and local cache."""
    tree: Path
    out: Path
    cache: Path

    def build(self) -> Result:
        return run_cli(("build", str(self.tree), "-o", str(self.out)), self.cache, self.tree.parent)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Shared:
    """Built once for the tests below (a cold build of the examples is ~15 s on 2 cores): the first two only read
    it, the last two rebuild it as a user would (nothing, then one edited recipe), passing in either order."""
    root = tmp_path_factory.mktemp("built")
    s = Shared(copy_examples(root / "recipes", example_models), root / "out", root / "cache")
    r = s.build()
    assert r.code == 0, r.text
    return s


def test_multi_target_build_produces_loadable_epcontext_models(shared: Shared) -> None:
    built = shared.out
    manifest = json.loads((built / "manifest.json").read_text())
    arts = manifest["artifacts"]
    by_target = {(a["recipe"], a["target"]["name"]) for a in arts}
    assert {("tiny_cnn", "SM8650"), ("tiny_cnn", "SM8750"), ("tiny_cnn", "SC8380XP"),
            ("tiny_cnn_int8", "SM8650"), ("mlp_fp16", "SM8650"), ("mlp_fp16", "SM8750")} <= by_target
    assert manifest["toolchain"]["qnn_sdk_build_id"].startswith("v2.")
    assert manifest["toolchain"]["onnxruntime-qnn"] != "missing"
    ctx_models = [a for a in arts if a["kind"] == "epcontext_model"]
    # 8 single-graph models (lora_mlp: 2), 2 graphs x 2 targets of the bundle, 1 multi-SoC model
    assert len(ctx_models) == 13
    for a in arts:
        p = built / a["path"]
        assert p.stat().st_size == a["size"]
        import hashlib
        assert hashlib.sha256(p.read_bytes()).hexdigest() == a["sha256"]
    for a in ctx_models:
        model = onnx.load(built / a["path"], load_external_data=False)
        node = model.graph.node[0]
        assert [n.op_type for n in model.graph.node].count("EPContext") == 1
        attrs = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        assert attrs["ep_sdk_version"].decode() == manifest["toolchain"]["qnn_sdk_build_id"]
        # The simulator cannot load multi-graph (segfault) or multi-SoC contexts: only single ones here.
        if a["recipe"] not in ("lm_bundle", "tiny_cnn_flex"):
            qnn_session(built / a["path"])  # loads with the QNN EP
    # embed: true gives one self-contained file, no .bin
    assert not (built / "SM8650" / "mlp_fp16" / "mlp_fp16_ctx_qnn.bin").exists()
    assert (built / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx_qnn.bin").is_file()


def test_simulator_output_close_to_float_model(shared: Shared) -> None:
    built, tree = shared.out, shared.tree
    sample = np.load(tree / "models" / "calib" / "tiny_cnn" / "sample_000.npz")["image"]
    ref = cpu_run(tree / "models" / "tiny_cnn.onnx", {"image": sample})[0]
    for target in ("SM8650", "SM8750"):
        got = qnn_session(built / target / "tiny_cnn" / "tiny_cnn_ctx.onnx").run(None, {"image": sample})[0]
        assert got.shape == ref.shape
        assert cosine(got, ref) > 0.99, (target, cosine(got, ref))
    x = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)
    ref = cpu_run(tree / "models" / "mlp.onnx", {"x": x})[0]
    got = qnn_session(built / "SM8650" / "mlp_fp16" / "mlp_fp16_ctx.onnx").run(None, {"x": x})[0]
    assert cosine(got, ref) > 0.999


def test_second_build_is_a_noop(shared: Shared) -> None:
    r = shared.build()
    assert r.code == 0, r.text
    assert "ctxbuild: up to date" in r.text
    assert last_build(shared.out) == {}


def test_editing_one_recipe_rebuilds_only_its_edges(shared: Shared) -> None:
    recipe = shared.tree / "tiny_cnn_int8.yaml"
    time.sleep(0.01)
    recipe.write_text(recipe.read_text() + "compile:\n  optimization_mode: 2\n")
    r = shared.build()
    assert r.code == 0, r.text
    assert set(last_build(shared.out)) == {"compile/tiny_cnn_int8@SM8650", "verify/tiny_cnn_int8@SM8650"}


def test_only_and_target_select_edges(tree: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--only", "tiny_cnn", "--target", "SM8750")
    assert r.code == 0, r.text
    ran = set(last_build(out))
    assert "compile/tiny_cnn@SM8750" in ran
    assert not any(i.startswith("compile/") and i != "compile/tiny_cnn@SM8750" for i in ran)
    r = ctxbuild("build", str(tree), "-o", str(out), "--only", "tiny_cnm")
    assert r.code == 2 and "did you mean 'tiny_cnn'" in r.err


def test_dry_run_writes_no_artifacts(tree: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--dry-run")
    assert r.code == 0, r.text
    assert "compile tiny_cnn@SM8650" in r.out
    assert not out.exists()  # planned in memory: no build.ninja, no state, no output directories


def test_plan_formats(tree: Path, ctxbuild) -> None:
    r = ctxbuild("plan", str(tree), "--format", "json")
    assert r.code == 0, r.text
    plan = json.loads(r.out)
    kinds = [a["kind"] for a in plan["actions"]]
    # one prepare per model however many recipes/targets use it (tiny_cnn x3 recipes, mlp, prefill, decode,
    # lora_mlp); compiles: 8 single-graph + 1 multi-SoC + 1 twin for it + 4 bundle twins; bundles: 2 targets;
    # lora_mlp: 3 adapters x 2 targets, each bound and verified
    assert kinds.count("prepare") == 5 and kinds.count("quantize") == 5
    assert kinds.count("compile") == 14 and kinds.count("bundle") == 2 and kinds.count("verify") == 13
    assert kinds.count("adapter") == 6 and kinds.count("verify_adapter") == 6
    assert ctxbuild("plan", str(tree), "--format", "dot").out.startswith("digraph")


def test_targets_lists_socs(ctxbuild) -> None:
    r = ctxbuild("targets", "--json")
    socs = {s["name"]: s for s in json.loads(r.out)}
    assert socs["SM8650"]["htp_arch"] == 75 and socs["SC8380XP"]["soc_model"] == 60
