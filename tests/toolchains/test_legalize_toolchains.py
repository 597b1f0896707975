"""Legalization per toolchain (ctxbuild/graph/legalize/toolchains.py): a rule runs for a release unless
bench/legalize_toolchains.py measured that release handling the rule's pattern itself. Measured: QAIRT 2.47
(onnxruntime-qnn 2.3.0) runs PyTorch's Erf GELU at int16, 2.4.0 on refuse it; so `gelu` is skipped for 2.3.0 only,
and the prepare record says why for every rule whose pattern the model has."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from bench.legalize_toolchains import gelu
from ctxbuild.graph.legalize import RULES
from ctxbuild.graph.legalize.toolchains import decide
from tests.conftest import build_with_toolchains, records


def test_a_rule_runs_unless_measured_unneeded() -> None:
    assert decide("gelu", "2.3.0")[0] is False
    # a float bias on a quantized Conv: computed right up to QAIRT 2.49 (2.5.0), wrongly from 2.50 (2.6.0) on
    assert decide("qdq_bias", "2.5.0")[0] is False and decide("qdq_bias", "2.6.0")[0] is True
    assert decide("gelu", "2.4.0") == (True, "needed by onnxruntime-qnn 2.4.0 (measured with the rule off: refused)")
    assert decide("a_new_rule", "2.7.0")[0] is True  # a rule added without measurements: every toolchain
    assert decide("clip", "9.9.9")[0] is True  # a release not measured
    assert all(decide(r.NAME, "2.7.0")[0] for r in RULES)  # the installed toolchain needs every rule (measured)


def _tree(root: Path) -> Path:
    model, samplers = gelu()
    (root / "calib").mkdir(parents=True)
    onnx.save(model, root / "gelu.onnx")
    g = np.random.default_rng(7)
    for i in range(4):
        np.savez(root / "calib" / f"s{i}.npz", **{k: f(g) for k, f in samplers.items()})
    for name, extra in (("gelu_new", ""), ("gelu_old", 'toolchain: "2.3.0"\n')):
        (root / f"{name}.yaml").write_text(f"model: gelu.onnx\nprecision: w8a16\ncalibration: {{dir: calib}}\n"
                                           f"targets: [SM8650]\n{extra}")
    return root


@pytest.mark.slow  # provisions onnxruntime-qnn 2.3.0 (cached in CI by the gate-matrix test)
def test_gelu_is_skipped_for_the_release_that_runs_erf(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "recipes")
    build_with_toolchains(tree, tmp_path / "out", tmp_path / "cache")
    prepared = {r["recipes"][0]: r for r in records(tmp_path / "out").values() if r["kind"] == "prepare"}
    new, old = prepared["gelu_new"], prepared["gelu_old"]
    assert new["rewrites"] == {"gelu": 1}
    assert new["rules"] == {"gelu": "needed by onnxruntime-qnn 2.7.0 (measured with the rule off: refused)"}
    assert "rewrites" not in old
    assert old["rules"] == {"gelu": "skipped: onnxruntime-qnn 2.3.0 handles it (measured with the rule off: "
                                    "passes (cosine 1.000))"}
    # and 2.3.0 does: the Erf compiled at int16 and verified on its simulator
    result = json.loads((tmp_path / "out" / "SM8650" / "gelu_old" / "gelu_old_verify.json").read_text())
    assert result["passed"], result
