"""Memory estimates of an `llm:` recipe's actions at plan time: the split counts the user's external data (an
exporter's decoder is a small .onnx beside gigabytes of weights), and the actions that hold one context length's
graphs at a time (quantize, the part checks) count their inputs once per CL, not once per graph of every CL."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

from ctxbuild.plan import memory
from ctxbuild.plan.planner import make_plan
from ctxbuild.recipes import recipe

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes" / "models"))
import llm_decoder  # noqa: E402


def _plan(tmp_path: Path, cls: list[int]):  # type: ignore[no-untyped-def]
    src = tmp_path / "recipes"
    if not src.exists():
        (src / "prompts").mkdir(parents=True)
        cfg = llm_decoder.Config(hidden=128, vocab=1024)
        onnx.save(llm_decoder.decoder(cfg), src / "llama.onnx", save_as_external_data=True, location="llama.onnx.data")
        np.save(src / "prompts" / "p0.npy", llm_decoder.prompts(cfg, 1, 8)[0])
    (src / "llm.yaml").write_text(
        "targets: [SM8650]\nllm:\n  model: llama.onnx\n  sequence_lengths: [16, 1]\n"
        f"  context_lengths: {cls}\n  parts: 2\n  precision: w8a16\n  prompts: {{dir: prompts}}\n")
    return make_plan(recipe.load([src]), tmp_path / "out")


def test_split_counts_the_external_data(tmp_path: Path) -> None:
    split = next(a for a in _plan(tmp_path, [64]).actions if a.kind == "llm_split")
    onnx_file = tmp_path / "recipes" / "llama.onnx"
    data = onnx_file.with_name("llama.onnx.data").stat().st_size
    assert onnx_file.stat().st_size < data / 10  # the weights are outside the .onnx
    assert memory.estimate(split) >= memory.BASE + memory.factor(split.kind, split.params) * data


def test_one_context_length_at_a_time(tmp_path: Path) -> None:
    # the graphs' sizes do not exist before the split ran: write stand-ins of equal size for every graph
    def estimates(cls: list[int]) -> dict[str, int]:
        plan = _plan(tmp_path, cls)
        for a in plan.actions:
            if a.kind in ("llm_quantize", "llm_part_eval"):
                for path in a.inputs.values():
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                    Path(path).write_bytes(b"\0" * 100_000)
        return {a.kind: memory.estimate(a) for a in plan.actions if a.kind in ("llm_quantize", "llm_part_eval")}

    one, two = estimates([64]), estimates([64, 128])
    for kind in ("llm_quantize", "llm_part_eval"):  # twice the graphs, the same estimate: one CL's sessions (one
        # compile) at a time
        assert one[kind] > memory.BASE
        assert abs(two[kind] - one[kind]) <= one[kind] // 50, (kind, one[kind], two[kind])


def test_3b_shape_plan_fits_24_gb(tmp_path: Path) -> None:
    """Llama-3.2-3B's shape (hidden 3072, 28 layers, 24/8 heads, MLP 8192, vocabulary 128,256, tied head), w4a16,
    5 parts x AR {128, 1} x CL {1024, 2048}, planned without building: its weights are holes of a sparse file (the
    sizes, no bytes). Every build action's estimate before any ran, the files earlier actions will write counted at
    their predicted sizes, fits this 24 GB machine, the verification's too (each part's check; the genai check,
    which counts each part's float weight file once: its AR sessions share the mapped file); the parts are the sizes
    a device takes. (At 4 parts the first and last parts' quantizes are estimated at 23.2 GiB since the quantizer's
    factor was fitted to the 1B shape's part holding the head, 5.5x its graph: docs/llm.md.)"""
    from ctxbuild.plan.planned_sizes import planned_sizes

    src = tmp_path / "recipes"
    (src / "prompts").mkdir(parents=True)
    cfg = llm_decoder.Config(vocab=128256, hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192,
                             max_positions=2048)
    onnx.save(llm_decoder.decoder(cfg, data=src / "llama.onnx.data", zeros=True), src / "llama.onnx")
    assert (src / "llama.onnx.data").stat().st_blocks == 0  # 12.85 GB of weights, none on disk
    np.save(src / "prompts" / "p0.npy", llm_decoder.prompts(cfg, 1, 100)[0])
    (src / "llm.yaml").write_text(
        "targets: [SM8650]\nllm:\n  model: llama.onnx\n  sequence_lengths: [128, 1]\n  context_lengths: [1024, 2048]\n"
        "  parts: 5\n  precision: w4a16\n  prompts: {dir: prompts}\n")
    recipes = recipe.load([src])
    plan = make_plan(recipes, tmp_path / "out")
    estimates = memory.planned(plan.actions)
    kinds = {a.kind for a in plan.actions}
    assert kinds == {"llm_split", "llm_quantize", "bundle", "llm_part_eval", "llm_package", "llm_genai"}, kinds
    too_big = {i: f"{e / 2**30:.1f} GiB" for i, e in estimates.items() if e > 24 * 10**9}
    assert not too_big, too_big
    # what the estimates counted: every part's float32 file (the tied head in the first and the last part) and QDQ
    # file (int4; the embedding, the head and the first and last layers int8)
    sizes = planned_sizes(plan.actions)
    floats = [n for p, n in sizes.items() if "-q" not in Path(p).parent.name]
    qdq = [n for p, n in sizes.items() if "-q" in Path(p).parent.name]
    matrices = 28 * (2 * 3072 * 3072 + 2 * 3072 * 1024 + 3 * 3072 * 8192) + 2 * 128256 * 3072  # the head a copy
    matrices += 2 * 2048 * 128  # the rotary tables (cos, sin), in the last part
    assert len(floats) == len(qdq) == 5 and sum(floats) == 4 * matrices
    assert 2.2e9 < sum(qdq) < 2.4e9 and max(qdq) < 0.85e9  # each part well under what one context holds
    genai = next(a for a in plan.actions if a.kind == "llm_genai")
    assert "model" not in genai.inputs  # the original export's tokens come from the split (layout.json)
    assert estimates[genai.id] == memory.BASE + int(memory.factor("llm_genai", genai.params) * sum(floats))
