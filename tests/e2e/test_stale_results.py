"""Issue 30, stale figures: after a recipe went from int16 to fp16, a build stopped before one SoC's
verification showed that SoC's int16 figures and "ok" in the summary, and left its int16 verify result in
OUT/<target>/. What the build did not reach is "not run", with no figures and no result files."""
from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import keep_only

RECIPE = """model: models/tiny_cnn.onnx
inputs:
  image: [1, 3, 64, 64]
precision: {precision}
calibration:
  dir: models/calib/tiny_cnn
targets: [SM8650, SM8750]
"""


def test_a_verification_the_build_did_not_reach_shows_no_earlier_figures(tree: Path, tmp_path: Path,
                                                                         ctxbuild) -> None:
    keep_only(tree)
    out = tmp_path / "out"
    (tree / "t.yaml").write_text(RECIPE.format(precision="int16"))
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    assert (out / "SM8750" / "t" / "t_verify.json").is_file()
    # fp16 with a bound it cannot meet; -k 1 -j 1 stop the build after SM8650's verification failed
    (tree / "t.yaml").write_text(RECIPE.format(precision="fp16") + "verify:\n  min_snr_db: 90\n")
    r = ctxbuild("build", str(tree), "-o", str(out), "-k", "1", "-j", "1", "--json")
    assert r.code == 1, r.text
    rows = json.loads(r.out)["accuracy"]
    failed = [a for a in rows if a["passed"] is False and a["cosine"] is not None]
    stopped = [a for a in rows if a["status"] == "not built"]
    assert len(failed) == 1 and len(stopped) == 1, rows
    assert stopped[0]["cosine"] is None and stopped[0]["passed"] is None, stopped
    target = stopped[0]["target"]
    assert not (out / target / "t" / "t_verify.json").exists()
    assert not (out / target).exists()  # its deliverables moved aside, no empty directory left
    assert json.loads((out / "manifest.json").read_text())["artifacts"] == []
    r = ctxbuild("build", str(tree), "-o", str(out), "-k", "1", "-j", "1")
    assert r.code == 1 and "not run (the build stopped first)" in r.out, r.text


def test_a_diagnosis_of_an_earlier_artifact_goes_when_the_graph_is_verified_again(tree: Path, tmp_path: Path,
                                                                                   ctxbuild) -> None:
    keep_only(tree)
    out = tmp_path / "out"
    strict = "verify:\n  min_snr_db: 90\n"  # neither precision meets it: both builds fail verification
    (tree / "t.yaml").write_text(RECIPE.format(precision="int16").replace("SM8650, SM8750", "SM8650") + strict)
    assert ctxbuild("build", str(tree), "-o", str(out)).code == 1
    assert ctxbuild("verify", str(tree), "-o", str(out), "--layers", "t").code == 1
    layers = out / "SM8650" / "t" / "t_layers.json"
    assert layers.is_file()
    (tree / "t.yaml").write_text(RECIPE.format(precision="fp16").replace("SM8650, SM8750", "SM8650") + strict)
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 1 and "FAILED (min cosine" in r.out, r.text
    assert not layers.exists()
