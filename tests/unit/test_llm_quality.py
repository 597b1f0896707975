"""The quality gates of `llm:` builds (ctxbuild/llm/quality.py): perplexity and greedy agreement computed right
(against numpy, and on the committed builder export: the float static parts reproduce the export's perplexity and
tokens exactly), the summary row's words, and bad `llm.eval` values refused at load time (exit 2, one line). A build
failing a gate: tests/e2e/test_llm.py (test_a_failing_part_names_its_graph_and_output), on a build it makes anyway."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ctxbuild.llm import quality

EXPORT = Path(__file__).parents[1] / "exports" / "llama_builder"


def test_perplexity_agreement_and_gates_arithmetic() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 7)).astype(np.float32)
    targets = np.array([0, 3, 6, 2, 2])
    p = np.exp(logits.astype(np.float64)) / np.exp(logits.astype(np.float64)).sum(axis=1, keepdims=True)
    want = -np.log(p[np.arange(5), targets])
    got = quality.nll(logits, targets)
    assert np.allclose(got, want, rtol=1e-12)
    # pooled over every token, not averaged per segment
    a, b = want[:2], want[2:]
    assert quality.perplexity([a, b]) == pytest.approx(float(np.exp(want.mean())))
    assert quality.perplexity([quality.summary(a), quality.summary(b)]) == pytest.approx(float(np.exp(want.mean())))
    assert [len(s) for s in quality.segments(np.arange(10), 4)] == [4, 4, 2]
    assert [len(s) for s in quality.segments(np.arange(9), 4)] == [4, 4]  # a 1-token tail predicts nothing
    assert len(quality.segments(np.arange(100), 4, 3)) == 3
    # teacher-forced agreement: the first step whose top-1 differs is where a free greedy decode diverges
    onehot = [np.eye(5)[t] for t in (1, 2, 3, 4)]
    forced = [onehot[:2] + [np.eye(5)[0]] + onehot[3:], onehot]
    got = quality.agreement([[1, 2, 3, 4], [1, 2, 3, 4]], forced)
    assert got == {"steps": 8, "agreement": 0.875, "first_divergence": [2, None]}
    t = {"max_ppl_ratio": 1.03, "min_agreement": 0.95}
    assert quality.failures({"simulator": {"ppl_ratio": 1.0299, "agreement": 0.95, "steps": 16, "tokens": 63}}, t) == []
    assert quality.failures({"QDQ parts on the CPU": {"ppl_ratio": 1.2, "agreement": 0.5, "steps": 128, "tokens": 900},
                             "simulator": {"ppl_ratio": float("nan"), "agreement": None, "steps": 0, "tokens": 63}}, t) == [
        "QDQ parts on the CPU: perplexity 1.200x the float export's (max 1.03) over 900 tokens",
        "QDQ parts on the CPU: greedy agreement 0.50 (min 0.95) over 128 steps",
        "simulator: perplexity nanx the float export's (max 1.03) over 63 tokens"]
    # a figure just past its gate shows the digits that put it there (0.9453 is not "0.95 (min 0.95)")
    assert quality.failures({"CPU": {"ppl_ratio": 1.0304, "agreement": 0.9453, "steps": 128, "tokens": 824}}, t) == [
        "CPU: perplexity 1.0304x the float export's (max 1.03) over 824 tokens",
        "CPU: greedy agreement 0.945 (min 0.95) over 128 steps"]


def test_the_summary_row_of_a_quality_check_gives_its_figures_and_gates() -> None:
    from ctxbuild.outputs import summary

    q = {"qdq_cpu": {"ppl_ratio": 1.0049, "agreement": 0.9753}, "simulator": {"ppl_ratio": 1.31, "agreement": 0.5},
         "texts": []}
    row = {"passed": False, "quality": summary.quality_line(q), "thresholds": {"max_ppl_ratio": 1.15, "min_agreement": 0.8}}
    assert summary._verdict(row) == ("FAILED (CPU ppl 1.005x, agreement 0.98; simulator ppl 1.310x, agreement 0.50; "
                                     "max 1.15x, min 0.8)")
    q["qdq_cpu"]["agreement"] = 0.9453
    gates = {"max_ppl_ratio": 1.03, "min_agreement": 0.95}
    assert summary.quality_line(q, gates).startswith("CPU ppl 1.005x, agreement 0.945;")


def test_the_float_static_parts_reproduce_the_exports_perplexity_and_tokens(tmp_path: Path) -> None:
    """On the committed model-builder export: the float static graphs (2 parts, AR 8, CL 64) chained as a device runs
    them give the export's own perplexity (each segment one call of the export) and its greedy tokens: ratio 1.0,
    agreement 1.0. What the gates compare is therefore only what quantization and the HTP change."""
    from tokenizers import Tokenizer

    from ctxbuild.llm import pipeline, static
    from ctxbuild.llm.prompts import DEFAULT_TEXT

    cl, ar = 64, 8
    graphs = static.specs(2, [ar, 1], [cl])
    dst = {g.name: tmp_path / f"{g.name}.onnx" for g in graphs}
    shape = static.write_static_graphs(EXPORT / "model.onnx", 2, [ar, 1], [cl], dst,
                                       [tmp_path / static.weights_name(p, 2) for p in range(2)])
    ranges = static.part_ranges(shape.layers, 2)
    ids = np.array(Tokenizer.from_file(str(EXPORT / "tokenizer.json")).encode(DEFAULT_TEXT.read_text()).ids, np.int64)
    segs = quality.segments(ids, cl, 6)
    want = quality.export_nll(EXPORT / "model.onnx", segs)
    prompts = [np.load(f) for f in sorted((EXPORT / "prompts").glob("*.npy"))]
    floats = {"text": {"segments": [s.tolist() for s in segs]}, "by_segment": [quality.summary(x) for x in want],
              "prompts": [{"ids": p.tolist(), "tokens": pipeline.reference_generate(EXPORT / "model.onnx", p,
                                                                                     cl - len(p)).tokens} for p in prompts]}
    run = pipeline.cpu_runner({(g.part, g.ar, g.cl): dst[g.name] for g in graphs})
    got = quality.measure(run, ranges, (shape.kv_heads, shape.head_dim), floats, cl, ar, free=True)
    assert got["segments"] == 6 and got["tokens"] == 6 * (cl - 1)
    assert got["ppl_ratio"] == pytest.approx(1.0, abs=2e-4) and got["ppl"] > 1, got
    assert got["agreement"] == 1.0 and got["first_divergence"] == [None] * len(prompts), got
    assert got["generated"] == [p["tokens"] for p in floats["prompts"]]
    # the simulator's subset: the first windows of the first segment, against the float NLL of the same tokens
    floats["first_nll"] = want[0].tolist()
    sub = quality.measure(run, ranges, (shape.kv_heads, shape.head_dim), floats, cl, ar,
                          {"windows": 2, "prompts": 1, "tokens": 5})
    assert sub["tokens"] == 2 * ar - 1 and sub["steps"] == 5 and sub["first_divergence"] == [None], sub
    assert sub["float_ppl"] == pytest.approx(float(np.exp(want[0][:2 * ar - 1].mean())), rel=1e-4)
    assert sub["ppl_ratio"] == pytest.approx(1.0, abs=2e-4)


def _recipe(d: Path, **llm: object) -> Path:
    spec = {"model": str(EXPORT / "model.onnx"), "sequence_lengths": [8, 1], "context_lengths": [64], "parts": 2,
            "precision": "w8a16", "prompts": {"dir": str(EXPORT / "prompts"), "samples": 2, "verify": 2}, **llm}
    d.mkdir(exist_ok=True)
    f = d / "llama.yaml"
    f.write_text(json.dumps({"name": "llama", "llm": spec, "targets": ["SM8650"]}))
    return f


@pytest.mark.parametrize("llm,expect", [
    ({"eval": {"text": "missing.txt"}}, "llm.eval.text 'missing.txt' not found"),
    ({"max_ppl_ratio": 0.9}, "max_ppl_ratio"),
    ({"min_agreement": 1.5}, "min_agreement"),
    ({"eval": {"tokens": 0}}, "tokens"),
    ({"eval": {"simulator": {"segments": 1}}}, "segments"),
])
def test_bad_eval_values_exit_2_with_one_line(tmp_path: Path, llm: dict[str, object], expect: str) -> None:
    from ctxbuild.errors import RecipeError
    from ctxbuild.recipes import recipe

    f = _recipe(tmp_path / "r", **llm)
    with pytest.raises(RecipeError) as e:
        recipe.load([f])
    assert e.value.exit_code == 2 and expect in str(e.value) and "llama.yaml:" in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_an_eval_text_needs_the_exports_tokenizer(tmp_path: Path) -> None:
    import shutil

    from ctxbuild.errors import RecipeError
    from ctxbuild.recipes import recipe

    model = tmp_path / "m"
    shutil.copytree(EXPORT, model, ignore=shutil.ignore_patterns("tokenizer*"))
    (model / "text.txt").write_text("Some text.\n")
    f = _recipe(tmp_path / "r", model=str(model / "model.onnx"), prompts={"dir": str(model / "prompts")},
                eval={"text": str(model / "text.txt")})
    with pytest.raises(RecipeError, match="llm.eval.text needs the export's tokenizer.json"):
        recipe.load([f])


def test_the_simulator_subset_drops_the_prompts_for_large_parts(tmp_path: Path) -> None:
    from ctxbuild.actions.llm_part_eval import SUBSET_ABOVE
    from ctxbuild.actions.llm_quality import simulator_subset
    from ctxbuild.recipes.llm import SIMULATOR_SUBSET, SIMULATOR_SUBSET_LARGE

    small, large = tmp_path / "p1.data", tmp_path / "p2.data"
    small.write_bytes(b"\0" * 1024)
    with large.open("wb") as f:  # sparse: the size is what counts
        f.truncate(SUBSET_ABOVE + 1)
    assert SIMULATOR_SUBSET_LARGE["prompts"] == 0 < SIMULATOR_SUBSET["prompts"]
    assert simulator_subset({"qdq:a.data": str(small), "qdq:a": str(small)}, {}) == SIMULATOR_SUBSET
    assert simulator_subset({"qdq:a.data": str(small), "qdq:b.data": str(large)}, {}) == SIMULATOR_SUBSET_LARGE
    # what the recipe gives wins over either default
    assert simulator_subset({"qdq:b.data": str(large)}, {"prompts": 2})["prompts"] == 2
