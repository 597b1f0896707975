"""Weight-shared bundles built by the oldest published toolchain: `toolchain: {qairt: "2.47"}` (onnxruntime-qnn
2.3.0, provisioned on demand) on the bundle example and the LLM example. Every graph of a bundle lands in one
context binary that both libQnnSystem (`ctxbuild inspect`) and the gate (`ctxbuild check`) read as QAIRT 2.47.
The x86 simulator cannot load multi-graph contexts on any release; the LLM's single-graph twins run on 2.3.0's
simulator in its verification."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from tests.conftest import build_with_toolchains, RECIPES, keep_only, llm_part_checks

OLD = 'toolchain: {qairt: "2.47"}\n'


@pytest.fixture(scope="module")
def old_out(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    """The examples lm_bundle and llm_tiny (two parts, each AR {16, 1} x CL {64, 128}) for QAIRT 2.47, on one SoC."""
    root = tmp_path_factory.mktemp("old_bundles")
    tree = root / "recipes"
    shutil.copytree(example_models, tree / "models")
    keep_only(tree)
    (tree / "lm_bundle.yaml").write_text(
        (RECIPES / "lm_bundle.yaml").read_text().replace("targets: [phones]", "targets: [SM8650]") + OLD)
    (tree / "llm_tiny.yaml").write_text(
        (RECIPES / "llm_tiny.yaml").read_text().replace("targets: [phones]", "targets: [SM8650]") + OLD)
    build_with_toolchains(tree, root / "out", root / "cache")
    return root / "out"


BUNDLES = {  # .bin -> the wrappers of its graphs, under SM8650/<recipe>/
    "lm_bundle/lm_bundle_qnn.bin": ["prefill", "decode"],
    **{f"llm_tiny/llm_tiny_{p}_of_2_qnn.bin": [f"{k}_cl{cl}_{p}_of_2" for cl in (64, 128)
                                                for k in ("prompt_ar16", "token_ar1")] for p in (1, 2)},
}


def _bin_named(wrapper: Path) -> str:
    node = next(n for n in onnx.load(wrapper, load_external_data=False).graph.node if n.op_type == "EPContext")
    return next(a.s.decode() for a in node.attribute if a.name == "ep_cache_context")


@pytest.mark.parametrize("binary", sorted(BUNDLES))
def test_every_graph_of_a_bundle_is_in_one_qairt_2_47_binary(old_out: Path, ctxbuild, binary: str) -> None:
    path = old_out / "SM8650" / binary
    for graph in BUNDLES[binary]:
        assert _bin_named(path.parent / f"{graph}_ctx.onnx") == path.name, graph
    r = ctxbuild("inspect", "--json", str(path))
    assert r.code == 0, r.text
    (b,) = json.loads(r.out)["binaries"]
    assert len(b["graphs"]) == len(BUNDLES[binary]) and b["build_id"].startswith("v2.47.0."), b["build_id"]
    manifest = json.loads((old_out / "manifest.json").read_text())
    row = next(a for a in manifest["artifacts"] if a["path"] == f"SM8650/{binary}")
    assert row["toolchain"] == "onnxruntime-qnn-2.3.0"
    # the shared weights are stored once: the bundle is well under its graphs built apart (measured: 0.43 to 0.56)
    assert row["weight_sharing"]["bundle_bin_size"] < 0.7 * row["weight_sharing"]["separate_bin_size"], row


def test_the_llm_twins_ran_on_the_old_simulator(old_out: Path) -> None:
    checks = llm_part_checks(old_out / "SM8650" / "llm_tiny")
    assert set(checks) == {"part1_of_2", "part2_of_2"}
    for result in checks.values():  # each part's twins, compiled by the old toolchain, on its simulator
        assert result["passed"] and set(result["by_cl"]) == {"64", "128"}, result
        assert all(g["calls"] == (2 if name.startswith("prompt") else 4) for by_cl in result["by_cl"].values()
                   for name, g in by_cl["simulator"].items()), result


def test_the_gate_passes_them_for_qairt_2_47(old_out: Path, ctxbuild) -> None:
    r = ctxbuild("check", str(old_out), "--runtime", "qairt=2.47", "--json")
    assert r.code == 0, r.text
    verdicts = {row["path"]: row["verdict"] for row in json.loads(r.out)}
    for binary, graphs in BUNDLES.items():
        for graph in graphs:
            assert verdicts[f"SM8650/{binary.split('/')[0]}/{graph}_ctx.onnx"] == "loads", verdicts
