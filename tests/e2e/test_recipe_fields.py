"""Recipe fields that were accepted or misreported (issue 19, items 17, 18, 21): each is refused at plan
time with one line naming the file:line and field, exit 2."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import keep_only

HEAD = "model: models/mlp.onnx\nprecision: fp16\n"


@pytest.mark.parametrize("body, expect", [
    # 17: an unknown key inside `verify:` or a custom target said "expected boolean, got LineDict"
    ("targets: [SM8650]\nverify:\n  cosin: 0.9\n", [":5:", "unknown key 'cosin'", "did you mean 'min_cosine'"]),
    ("targets:\n  - {name: mine, soc_model: 57, htp_arch: 75, vtcm: 8}\n", [":4:", "unknown key 'vtcm'", "did you mean 'vtcm_mb'"]),
    ("targets: [SM8650]\nverify: 3\n", [":4:", "verify", "expected boolean or mapping, got int 3"]),
    # 18: target names that are OUT's own files (with report.html the build exited 0 with no report)
    ("targets:\n  - {name: report.html, soc_model: 57, htp_arch: 75}\n", [":4:", "'report.html'", "OUT's own"]),
    ("targets:\n  - {name: manifest.json, soc_model: 57, htp_arch: 75}\n", [":4:", "'manifest.json'", "OUT's own"]),
    ("targets:\n  - {name: Build.Ninja, soc_model: 57, htp_arch: 75}\n", [":4:", "'Build.Ninja'", "OUT's own"]),
    # 21: soc_model beyond QNN's uint32 was dropped silently; vtcm_mb beyond the SoC's VTCM accepted
    ("targets:\n  - {name: mine, soc_model: 4294967296, htp_arch: 75}\n", [":4:", "soc_model", "4294967295"]),
    ("targets:\n  - {name: mine, soc_model: 57, htp_arch: 75, vtcm_mb: 64}\n", [":4:", "vtcm_mb 64", "SM8650", "8 MB"]),
    ("targets: [SM8650]\ncompile:\n  vtcm_mb: 16\n", [":5:", "compile.vtcm_mb 16", "SM8650", "8 MB"]),
    # issue 30: another backend failed every node with a cpu_fallback hint; backend_path with ctxbuild's
    # backend_type ended in onnxruntime's message cut at "Only one of 'backe"
    ("targets: [SM8650]\ncompile:\n  provider_options: {backend_type: gpu}\n", [":5:", "backend_type", "remove it"]),
    ("targets: [SM8650]\ncompile:\n  provider_options: {backend_path: /x/libQnnHtp.so}\n",
     [":5:", "backend_path", "remove it"]),
    # a oneOf inside a oneOf said "'fp32' is not valid under any of the given schemas", and a
    # list where a mapping goes "expected mapping or list, got mapping" about the enclosing field
    ("targets: [SM8650]\nquantization:\n  nodes: {fc: fp61}\n",
     [":5:", "quantization.nodes.fc", "expected mapping (activations, weights) or 'fp16', got str 'fp61'",
      "did you mean 'fp16'"]),
    ("targets: [SM8650]\nquantization:\n  nodes: {fc: {activations: int16}}\n",
     [":5:", "quantization.nodes.fc.activations", "'int16' is not one of uint8, uint16"]),
    ("targets: [SM8650]\nquantization:\n  nodes: [fc]\n", [":5:", "quantization.nodes", "expected mapping, got list"]),
    # numbered tensor and node names (PyTorch exports' `391`) read as numbers said no more than
    # "mapping keys must be strings, got 391" (no field, nothing to do) or "expected string, got int 391"
    ("targets: [SM8650]\nquantization:\n  nodes: {391: fp16}\n",
     [":5:", "quantization.nodes: a key must be a string, got int 391", "quote it: '391'"]),
    ("targets: [SM8650]\noutputs: [391]\n", [":4:", "outputs.0: expected string, got int 391", "quote it: '391'"]),
    # no hint for a name given in the wrong case, or a list field given one value
    ("targets: [SM8650]\nquantization:\n  nodes: {fc: FP16}\n", [":5:", "got str 'FP16'", "did you mean 'fp16'"]),
    ("targets: [SM8650]\noutputs: h\n", [":4:", "outputs: expected list, got str 'h'", "write it as a list: [h]"]),
    # a newcomer's: the sample directory alone where a mapping with `dir` goes said no more than the types
    ("targets: [SM8650]\ncalibration: models/calib\n", [":4:", "calibration: expected mapping, got str",
                                                        "write it as a mapping: {dir: models/calib}"]),
    ("targets: [SM8650]\nverify: models/calib\n", [":4:", "verify: expected boolean or mapping, got str",
                                                   "write it as a mapping: {dir: models/calib}"]),
    # an entry not indented under its key, or indented with a tab (which an editor does not show)
    ("targets: [SM8650]\nverify:\nmin_cosine: 0.9\n",
     [":5:", "unknown key 'min_cosine'", "indent it under `verify:` (the key before it, which holds nothing)"]),
    ("targets: [SM8650]\nverify:\n\tmin_cosine: 0.9\n", [":5:", "invalid YAML",
                                                         "the line is indented with a tab: YAML indents with spaces"]),
    # a hint's field path (`compile.split_outputs: true`) pasted as a key: "unknown key", and every known key listed
    ("targets: [SM8650]\ncompile.split_outputs: true\n", [":4:", "unknown key 'compile.split_outputs'",
                                                          "YAML does not nest by dots: write compile: {split_outputs: "
                                                          "true} (in the recipe's compile: if it has one)"]),
])
def test_bad_field_is_one_line(tree: Path, tmp_path: Path, ctxbuild, body: str, expect: list[str]) -> None:
    keep_only(tree)
    (tree / "bad.yaml").write_text(HEAD + body)
    r = ctxbuild("plan", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2, r.text
    assert "Traceback" not in r.err
    line = r.err.strip().splitlines()[-1]
    assert "bad.yaml" in line, line
    for e in expect:
        assert e in line, line


def test_custom_targets_within_range_still_plan(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree)
    (tree / "ok.yaml").write_text(HEAD + "targets:\n  - {name: mine, soc_model: 57, htp_arch: 75, vtcm_mb: 4}\n"
                                  "  - {name: future, soc_model: 500, htp_arch: 81, vtcm_mb: 32}\n")
    r = ctxbuild("plan", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 0, r.text
    assert "compile/ok@mine" in r.out and "compile/ok@future" in r.out


@pytest.mark.parametrize("given, hint", [
    ("W8A16", "write precision: w8a16 (precision names are lower case)"),
    ("w4a16", "w4a16 (uint16 activations, int4 weights, HTP v73 or newer) is an llm: recipe's precision "
              "(llm.precision, docs/llm.md)"),
    ("float32", "write precision: fp16 (the HTP computes float models in fp16)"),
    ("int61", "did you mean 'w8a16'?"),  # close to an alias (int16): its table name is offered
])
def test_other_tools_precision_names_say_what_they_are_here(tmp_path: Path, given: str, hint: str) -> None:
    """A precision a model recipe does not take is answered in the table's names (recipes/precisions.py)."""
    from ctxbuild.errors import RecipeError
    from ctxbuild.recipes import recipe

    (tmp_path / "r.yaml").write_text(f"model: m.onnx\nprecision: {given}\ntargets: [SM8650]\n")
    with pytest.raises(RecipeError) as e:
        recipe.load([tmp_path / "r.yaml"])
    assert str(e.value) == (f"{tmp_path / 'r.yaml'}:2: precision: '{given}' is not one of w8a16, w8a8, w16a16, fp16, "
                            f"qdq, auto ({hint})"), str(e.value)
