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
    assert memory.estimate(split) >= memory.BASE + 3.0 * data


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
