"""Memory estimates of an `llm:` recipe's actions at plan time: the split counts the user's external data (an
exporter's decoder is a small .onnx beside gigabytes of weights), and the actions that hold one context length's
graphs at a time (quantize, the part checks) count their inputs once per CL, not once per graph of every CL. And what
keeps those estimates true at LLM sizes: the CPU runner's outputs hold no closed session's memory, and calibration
keeps its recorded calls compactly."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

from ctxbuild.plan import memory
from ctxbuild.plan.planner import make_plan
from ctxbuild.recipes import recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes" / "models"))
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

    one, two = estimates([128]), estimates([64, 128])
    for kind in ("llm_quantize", "llm_part_eval"):  # twice the graphs, the same estimate: one CL's sessions (one
        # compile) at a time (the part check's activations grow with the largest CL, the same here)
        assert one[kind] > memory.BASE
        assert abs(two[kind] - one[kind]) <= one[kind] // 50, (kind, one[kind], two[kind])


def _sparse_plan(tmp_path: Path, cfg: llm_decoder.Config, parts: int):  # type: ignore[no-untyped-def]
    """The plan of a w4a16 recipe x AR {128, 1} x CL {1024, 2048} over `cfg`'s decoder, its weights holes of a sparse
    file, and every action's estimate before any ran (plan/memory.planned)."""
    src = tmp_path / "recipes"
    (src / "prompts").mkdir(parents=True)
    onnx.save(llm_decoder.decoder(cfg, data=src / "llama.onnx.data", zeros=True), src / "llama.onnx")
    assert (src / "llama.onnx.data").stat().st_blocks == 0  # the sizes, no bytes
    np.save(src / "prompts" / "p0.npy", llm_decoder.prompts(cfg, 1, 100)[0])
    (src / "llm.yaml").write_text(
        "targets: [SM8650]\nllm:\n  model: llama.onnx\n  sequence_lengths: [128, 1]\n  context_lengths: [1024, 2048]\n"
        f"  parts: {parts}\n  precision: w4a16\n  prompts: {{dir: prompts}}\n")
    plan = make_plan(recipe.load([src]), tmp_path / "out")
    return plan, memory.planned(plan.actions)


def test_3b_shape_plan_fits_24_gb(tmp_path: Path) -> None:
    """Llama-3.2-3B's shape (hidden 3072, 28 layers, 24/8 heads, MLP 8192, vocabulary 128,256, tied head), w4a16,
    4 parts x AR {128, 1} x CL {1024, 2048}, planned without building: its weights are holes of a sparse file (the
    sizes, no bytes). Every build action's estimate before any ran, the files earlier actions will write counted at
    their predicted sizes, fits this 24 GB machine, the verification's too (each part's check; the genai check,
    which counts each part's float weight file once: its AR sessions share the mapped file); the parts are the sizes
    a device takes. The largest: the split (20.0 GiB), the genai check (19.1), the first and last parts' quantizes
    (18.7: onnxruntime's quantizer on a 4.4 GB graph, 4.5x) and calibration (18.3: every part's float sessions of
    one CL and AR, 1.3x their 14.4 GB, and their activations at CL 2048), docs/llm-reference.md."""
    from ctxbuild.plan.planned_sizes import planned_sizes

    cfg = llm_decoder.Config(vocab=128256, hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192,
                             max_positions=2048)
    plan, estimates = _sparse_plan(tmp_path, cfg, 4)  # 12.85 GB of weights, none on disk
    kinds = {a.kind for a in plan.actions}
    assert kinds == {"llm_split", "llm_quantize", "bundle", "llm_part_eval", "llm_package", "llm_genai", "llm_float_eval",
                     "llm_quality_cpu", "llm_quality", "compile"}, kinds
    too_big = {i: f"{e / 2**30:.1f} GiB" for i, e in estimates.items() if e > 24 * 10**9}
    assert not too_big, too_big
    # what the estimates counted: every part's float32 file (the tied head in the first and the last part) and QDQ
    # file (int4; the embedding, the head and the first and last layers int8)
    sizes = planned_sizes(plan.actions)
    floats = [n for p, n in sizes.items() if "-q" not in Path(p).parent.name]
    qdq = [n for p, n in sizes.items() if "-q" in Path(p).parent.name]
    matrices = 28 * (2 * 3072 * 3072 + 2 * 3072 * 1024 + 3 * 3072 * 8192) + 2 * 128256 * 3072  # the head a copy
    matrices += 2 * 2048 * 128  # the rotary tables (cos, sin), in the last part
    assert len(floats) == len(qdq) == 4 and sum(floats) == 4 * matrices
    assert 2.2e9 < sum(qdq) < 2.4e9 and max(qdq) < 0.85e9  # each part well under what one context holds
    genai = next(a for a in plan.actions if a.kind == "llm_genai")
    assert "model" not in genai.inputs  # the original export's tokens come from the split (layout.json)
    assert estimates[genai.id] == memory.BASE + int(memory.factor("llm_genai", genai.params) * sum(floats))


def test_1b_shape_estimates_cover_its_measured_peaks(tmp_path: Path) -> None:
    """The whole Llama-3.2-1B shape at 4 parts, built on the 2-core x86_64 machine (ctxbuild 1e60b32,
    docs/llm-reference.md "At LLM sizes"): each action's estimate covers its measured peak RSS (GiB) by 3% at least:
    the quantizes and the split as measured once calibration and the split's records no longer held closed
    sessions' arenas (9.35-10.79 and 8.07 GiB before), the genai check's what it held (its RSS counts the mapped part
    files once per AR session)."""
    cfg = llm_decoder.Config(vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192,
                             max_positions=2048)
    plan, estimates = _sparse_plan(tmp_path, cfg, 4)
    measured = {"llm_split/": [6.54], "llm_quantize/": [7.42, 6.63, 6.53, 7.85], "bundle/": [6.14, 2.31, 2.27, 6.21],
                "llm_part_eval/": [1.91, 1.61, 1.60, 2.66], "llm_genai/": [7.4]}
    for prefix, peaks in measured.items():
        ids = sorted(a.id for a in plan.actions if a.id.startswith(prefix))
        assert len(ids) == len(peaks), (prefix, ids)
        for i, peak in zip(ids, peaks):
            assert peak * 1.03 < estimates[i] / 2**30 < peak * 1.6, (i, peak, estimates[i] / 2**30)


def _static(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 3-layer decoder's static graphs, 2 parts x AR {8, 1} x CL {24}, its layout and 2 prompts."""
    from ctxbuild.llm import static
    from ctxbuild.llm.layout import Layout

    cfg = llm_decoder.Config(layers=3, max_positions=64)
    onnx.save(llm_decoder.decoder(cfg), tmp_path / "llama.onnx")
    graphs = static.specs(2, [8, 1], [24])
    dst = {g.name: tmp_path / f"{g.name}.onnx" for g in graphs}
    shape = static.write_static_graphs(tmp_path / "llama.onnx", 2, [8, 1], [24], dst,
                                       [tmp_path / static.weights_name(p, 2) for p in range(2)])
    layout = Layout(shape.layers, shape.kv_heads, shape.head_dim, cfg.vocab, cfg.hidden,
                    static.part_ranges(shape.layers, 2), graphs, [])
    return layout, {(g.part, g.ar, g.cl): dst[g.name] for g in graphs}, llm_decoder.prompts(cfg, 2, 11)


def test_cpu_runner_outputs_hold_no_session_memory(tmp_path: Path) -> None:
    """onnxruntime returns views of its session's activation arena; one kept after the session closed keeps the whole
    arena (a 32 MB output held 190 MB): calibration keeps the previous part's hidden states as its inputs, and at the
    1B shape 16 AR switches left GBs of closed sessions resident. The runner's outputs own their memory."""
    from ctxbuild.llm import pipeline

    layout, models, prompts = _static(tmp_path)
    kept: list[np.ndarray] = []

    def keep(part: int, ar: int, cl: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        got = run(part, ar, cl, feeds)
        kept.extend(got.values())
        return got

    run = pipeline.cpu_runner(models)
    pipeline.generate(keep, layout.parts, (layout.kv_heads, layout.head_dim), prompts[0], 3, 24, 8)
    assert kept and all(v.base is None and v.flags.owndata for v in kept)


def test_calibration_keeps_compact_calls_that_give_the_decodes_feeds(tmp_path: Path) -> None:
    """The quantizer reads exactly what the float decode fed each of the part's graphs (the first MAX_SAMPLES calls),
    while calibration holds only the past KV rows the prompt filled (at CL 2048 a short prompt's are a few percent)."""
    from ctxbuild.actions.llm_quantize import _Reader, calibration_feeds
    from ctxbuild.llm import pipeline

    layout, models, prompts = _static(tmp_path)
    run = pipeline.cpu_runner(models)
    fed: dict[tuple[int, int, int], list[dict[str, np.ndarray]]] = {}

    def spy(part: int, ar: int, cl: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fed.setdefault((part, ar, cl), []).append(feeds)
        return run(part, ar, cl, feeds)

    for prompt in prompts:
        pipeline.generate(spy, layout.parts, (layout.kv_heads, layout.head_dim), prompt, 6, 24, 8)
    for part in (0, 1):
        kept = calibration_feeds(layout, models, prompts, 6, part)
        assert {k[0] for k in kept} == {part}
        for key, calls in kept.items():
            assert len(calls) == min(len(fed[key]), 16)
            reader = _Reader(calls)
            for original in fed[key][:len(calls)]:
                feeds = reader.get_next()
                assert feeds is not None and feeds.keys() == original.keys()
                assert all(np.array_equal(feeds[k], original[k]) and feeds[k].dtype == original[k].dtype for k in feeds)
            assert reader.get_next() is None
            kv = [v for c in calls for k, v in c.inputs.items() if k.startswith("past_key_values.")]
            assert kv and all(v.shape[2] == c.past for c in calls for k, v in c.inputs.items() if k.startswith("past_"))
