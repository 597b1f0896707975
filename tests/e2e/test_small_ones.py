"""Issue 19, item 24: `verify --layers` named an `--only` the user never passed; a multi-SoC prebuilt binary
was refused as if it had been built for another SoC."""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import keep_only


def test_layers_with_unknown_recipe_names_its_own_flag(tree: Path, tmp_path: Path, ctxbuild) -> None:
    r = ctxbuild("verify", str(tree), "-o", str(tmp_path / "out"), "--layers", "mlp_fp61")
    assert r.code == 2, r.text
    line = r.err.strip().splitlines()[-1]
    assert "--layers mlp_fp61: no such recipe" in line and "did you mean 'mlp_fp16'" in line, line
    assert "--only" not in r.err


def test_multi_soc_prebuilt_serves_each_of_its_socs(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "tiny_cnn_flex.yaml")
    first = tmp_path / "first"
    r = ctxbuild("build", str(tree), "-o", str(first), "--no-verify")
    assert r.code == 0, r.text
    bins = list(first.rglob("tiny_cnn_flex*_qnn.bin"))
    assert len(bins) == 1, bins
    shutil.copy(bins[0], tree / "models" / "flex.bin")
    keep_only(tree)
    (tree / "pre.yaml").write_text("prebuilt:\n  bin: models/flex.bin\ntargets: [X-Elite, SM8750]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--no-verify")
    assert r.code == 0, r.text
    assert (out / "SC8380XP" / "pre" / "pre_ctx.onnx").is_file() and (out / "SM8750" / "pre" / "pre_ctx.onnx").is_file()
    # A SoC the binary does not hold is still refused.
    (tree / "pre.yaml").write_text("prebuilt:\n  bin: models/flex.bin\ntargets: [SM8650]\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out2"), "--no-verify")
    assert r.code == 1 and "soc_model 69 / HTP v79, target SM8650 is soc_model 57" in r.err, r.text
