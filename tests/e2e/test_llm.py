"""LLMs (`llm:` recipes): the static rewrite reproduces the original decoder's greedy tokens, the build makes one
weight-shared binary per part and target holding its AR x CL graphs, verified token by token on the simulator,
a genai_config.json naming what was compiled; w4a16 puts int4 weights in; bad inputs exit 2 with one line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ctxbuild.graph.modelio import external_data_files
from ctxbuild.graph.nodenames import Names, named
from tests.conftest import RECIPES, keep_only, records

sys.path.insert(0, str(RECIPES / "models"))
import llm_decoder  # noqa: E402 - the example generator, a script beside the recipes

SMALL = llm_decoder.Config(layers=3, max_positions=128)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("llm")
    onnx.save(llm_decoder.decoder(SMALL), d / "llama.onnx")
    onnx.save(llm_decoder.genai_decoder(SMALL), d / "llama_genai.onnx")  # the same weights, model-builder style
    (d / "prompts").mkdir()
    for i, p in enumerate(llm_decoder.prompts(SMALL, 2, 11)):
        np.save(d / "prompts" / f"prompt_{i}.npy", p)
    return d


@pytest.mark.parametrize("model", ["llama.onnx", "llama_genai.onnx"])
def test_static_graphs_reproduce_the_original_greedy_tokens(decoder: Path, tmp_path: Path, model: str) -> None:
    from ctxbuild.llm import pipeline, static

    graphs = static.specs(2, [8, 1], [24, 32])
    dst = {g.name: tmp_path / f"{g.name}.onnx" for g in graphs}
    weights = [tmp_path / static.weights_name(p, 2) for p in range(2)]
    shape = static.write_static_graphs(decoder / model, 2, [8, 1], [24, 32], dst, weights)
    assert static.part_ranges(shape.layers, 2) == [(0, 2), (2, 3)]
    # static: batch 1, AR new tokens, CL - AR past positions, only the new positions out, a 4-D additive mask in
    token = onnx.load(dst["token_ar1_cl32_1_of_2"])
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*token.graph.input, *token.graph.output)}
    assert dims["past_key_values.0.key"] == [1, SMALL.kv_heads, 31, SMALL.head_dim]
    assert dims["present.1.value"] == [1, SMALL.kv_heads, 1, SMALL.head_dim]
    assert dims["attention_mask"] == [1, 1, 1, 32] and dims["hidden_states.2"] == [1, 1, SMALL.hidden]
    ops = {n.op_type for n in token.graph.node}
    assert not ops & {"Range", "Shape", "GroupQueryAttention", "SkipSimplifiedLayerNormalization"}, ops
    # the mask: one Where per attention (llm/mask.py), reading the input through one Less
    assert [n.op_type for n in token.graph.node if "attention_mask" in n.input] == ["Less"]
    # what the static pass and the exporter plug-in renamed is named as the export names it (a refusal, a failure)
    export = onnx.load(decoder / model, load_external_data=False).graph
    theirs = {n.name for n in export.node}
    names = Names(token)
    assert names.user_tensor("hidden_states.2") in {t for n in export.node for t in n.output}
    assert {names.user(n.name) for n in token.graph.node} <= theirs
    if model == "llama_genai.onnx":  # GroupQueryAttention written out: its nodes are the export's attention
        lowered = [n.name for n in token.graph.node if "_lowered_" in n.name and n.op_type == "Softmax"]
        attention = [n.name for n in export.node if n.op_type == "GroupQueryAttention"]
        assert [names.user(n) for n in lowered] == attention[:2], lowered  # part 1: layers 0, 1
        # a quantizer's DequantizeLinear of a tensor the plug-in made: by the export's node computing it
        q = "/model/layers.0/attn/lowered_q"
        assert named(token, [(f"{q}_DequantizeLinear", "DequantizeLinear")]) == [
            (f"the DequantizeLinear of '{q}' (computed in '{attention[0]}')", "DequantizeLinear")]
    # a part's AR x CL graphs name one weight file, the same range for a weight, and that file holds it once
    for p, w in enumerate(weights):
        mine = [onnx.load(dst[g.name], load_external_data=False) for g in graphs if g.part == p]
        assert {f for m in mine for f in external_data_files(m, dst[graphs[0].name])} == {f"external:{w.name}"}
        ranges = [{t.name: [(e.key, e.value) for e in t.external_data] for t in m.graph.initializer} for m in mine]
        assert all(r == ranges[0] for r in ranges)
        held = {(d["offset"], d["length"]) for d in map(dict, ranges[0].values()) if d}
        assert w.stat().st_size == sum(int(n) for _, n in held) > 0
    models = {(g.part, g.ar, g.cl): dst[g.name] for g in graphs}
    for prompt in (np.load(p) for p in sorted((decoder / "prompts").glob("*.npy"))):
        want = pipeline.reference_generate(decoder / model, prompt, 10)
        for cl in (24, 32):
            got = pipeline.generate(pipeline.cpu_runner(models), static.part_ranges(shape.layers, 2),
                                    (shape.kv_heads, shape.head_dim), prompt, 10, cl, 8)
            assert got.tokens == want.tokens
            assert max(float(np.abs(a - b).max()) for a, b in zip(got.logits, want.logits)) < 1e-3
        assert len(set(want.tokens)) > 3  # the generator's weights give a varied continuation, not one token


def test_recorded_calls_replay_the_float_parts(decoder: Path, tmp_path: Path) -> None:
    """What the split records for the part checks: per CL the first PREFILL_WINDOWS prefill windows, per prompt the
    first DECODE_STEPS token steps, each part's; fed back (past KV padded out, mask and positions rebuilt) they give
    the recorded outputs."""
    from ctxbuild.llm import pipeline, records, static

    graphs = static.specs(2, [8, 1], [24])
    dst = {g.name: tmp_path / f"{g.name}.onnx" for g in graphs}
    shape = static.write_static_graphs(decoder / "llama.onnx", 2, [8, 1], [24], dst,
                                       [tmp_path / static.weights_name(p, 2) for p in range(2)])
    run = pipeline.cpu_runner({(g.part, g.ar, g.cl): dst[g.name] for g in graphs})
    fed: list[tuple[int, int, dict[str, np.ndarray]]] = []

    def spy(part: int, ar: int, cl: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fed.append((part, ar, feeds))
        return run(part, ar, cl, feeds)

    recorder = records.Recorder(8)
    prompts = [np.load(p) for p in sorted((decoder / "prompts").glob("*.npy"))]  # 11 tokens: 2 windows of 8
    for prompt in prompts:
        pipeline.generate(recorder.runner(spy), static.part_ranges(shape.layers, 2), (shape.kv_heads, shape.head_dim),
                          prompt, 6, 24, 8)
    for part in (0, 1):
        recorder.write(part, tmp_path / f"r{part}.npz")
        calls = records.read(tmp_path / f"r{part}.npz")
        # the first prompt's 2 windows (the second reads the first's cache); 2 token steps of each prompt
        assert [(c.ar, c.past, c.valid) for c in calls] == [(8, 0, 8), (8, 8, 3), (1, 11, 1), (1, 12, 1), (1, 11, 1),
                                                             (1, 12, 1)]
        mine = [f for p, ar, f in fed if p == part]  # 2 windows + 5 steps per prompt
        kept = mine[:4] + mine[9:11]
        for c, original in zip(calls, kept):
            feeds = c.feeds()
            assert feeds.keys() == original.keys()
            assert all(np.array_equal(feeds[k], original[k]) for k in feeds)
            got = run(part, c.ar, c.cl, feeds)
            assert all(np.array_equal(records.compared(k, got[k], c.valid), v) for k, v in c.outputs.items())
            # KV: only the rows the call wrote for real tokens (a padded window's rows past the prompt are left out)
            assert all(v.shape[1] == c.valid for k, v in c.outputs.items() if k.startswith("present."))
        last = {k for c in calls for k in c.outputs if not k.startswith("present.")}
        assert last == ({"hidden_states.2"} if part == 0 else {"logits"})


def _recipe(d: Path, decoder: Path, **llm: object) -> Path:
    spec = {"model": str(decoder / "llama.onnx"), "sequence_lengths": [8, 1], "context_lengths": [24, 32],
            "parts": 2, "precision": "w8a16", "prompts": {"dir": str(decoder / "prompts"), "samples": 2, "verify": 2},
            "generate": 6, **llm}
    spec = {k: v for k, v in spec.items() if v is not None}  # None: leave the field out
    d.mkdir(exist_ok=True)
    f = d / "llama.yaml"
    f.write_text(json.dumps({"name": "llama", "llm": spec, "targets": ["SM8650"]}))
    return f


def test_example_builds_bundles_per_part_verified_with_a_genai_config(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """recipes/llm_tiny.yaml as `make build` builds it: 2 SoCs, 2 parts x AR {16, 1} x CL {64, 128}."""
    from ctxbuild.qnn.contextbin import describe

    shutil.copy(RECIPES / "llm_tiny.yaml", tree)  # the tree fixture leaves the LLM example out
    keep_only(tree, "llm_tiny.yaml")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    manifest = json.loads((out / "manifest.json").read_text())
    for target in ("SM8650", "SM8750"):
        d = out / target / "llm_tiny"
        assert sorted(p.name for p in d.glob("*.bin")) == ["llm_tiny_1_of_2_qnn.bin", "llm_tiny_2_of_2_qnn.bin"]
        for part in (1, 2):
            names = [f"{k}_cl{cl}_{part}_of_2" for cl in (64, 128) for k in ("prompt_ar16", "token_ar1")]
            for n in names:  # one wrapper per graph, all naming the part's one binary
                assert (d / f"{n}_ctx.onnx").is_file()
            info = describe(d / f"{names[0]}_ctx.onnx")
            assert len([g for b in info["binaries"] for g in b["graphs"]]) == 4
            rec = records(out)[f"bundle/llm_tiny.part{part}@{target}"]
            assert sorted(rec["graph_names"]) == sorted(names)  # graph -> its name inside the .bin
            row = next(a for a in manifest["artifacts"] if a["path"] == f"{target}/llm_tiny/llm_tiny_{part}_of_2_qnn.bin")
            assert row["weight_sharing"]["bundle_bin_size"] < row["weight_sharing"]["separate_bin_size"]
        results = [json.loads((d / "llm_verify" / f"part{part}_of_2.json").read_text()) for part in (1, 2)]
        for part, result in enumerate(results, 1):  # each part on the calls the float decode recorded
            assert result["passed"] and set(result["by_cl"]) == {"64", "128"}
            for by_cl in result["by_cl"].values():
                for backend in ("qdq_cpu", "simulator"):
                    assert len(by_cl[backend]) == 2  # the part's AR 16 and AR 1 graphs at that CL
                    for graph, checked in by_cl[backend].items():
                        # the first prompt's 2 windows; the first 2 token steps of each of the 2 prompts (a small
                        # part: every call on the simulator too, llm_part_eval.SUBSET_ABOVE)
                        assert checked["calls"] == (2 if graph.startswith("prompt") else 4), (graph, checked)
                        assert set(checked["outputs"]) == {f"present.{i}.{kv}" for i in (2 * part - 2, 2 * part - 1)
                                                           for kv in ("key", "value")} | {
                            "hidden_states.2" if part == 1 else "logits"}
                        assert all(m["cosine"] >= 0.95 for m in checked["outputs"].values())
                        if part == 2:  # top-1 against the float model's tokens
                            assert checked["outputs"]["logits"]["argmax_agreement"] >= 0.75
            rec = records(out)[f"llm_part_eval/llm_tiny.part{part}@{target}"]
            assert rec["simulator_seconds"] > 0 and rec["twin_bin_bytes"] > 0
        # the part checks compile theirs inside, not kept; the quality check's chain: the largest CL's, kept
        assert sorted(p.name for p in (out / ".ctxbuild" / "work" / "llm" / "twins" / target / "llm_tiny").glob("*_ctx.onnx")) \
            == sorted(f"{k}_cl128_{p}_of_2_ctx.onnx" for p in (1, 2) for k in ("prompt_ar16", "token_ar1"))
        wrapper = next(a for a in manifest["artifacts"] if a["path"] == f"{target}/llm_tiny/token_ar1_cl64_1_of_2_ctx.onnx")
        assert wrapper["verification"]["tokens_by_cl"] == results[0]["by_cl"]  # the part's figures in the manifest
        config = json.loads((d / "genai_config.json").read_text())
        stages = [s for stage in config["model"]["decoder"]["pipeline"] for s in stage.values()]
        assert [s["filename"] for s in stages if "session_options" in s] == [
            f"{k}_cl128_{p}_of_2_ctx.onnx" for p in (1, 2) for k in ("prompt_ar16", "token_ar1")]
        assert all((d / s["filename"]).is_file() for s in stages)  # the mask and KV stages beside it (test_llm_genai.py)
        assert config["model"]["context_length"] == 128 and config["model"]["decoder"]["num_hidden_layers"] == 4
        # the build ran that config with onnxruntime-genai (float CPU twin): the original's tokens (generate: 8 set)
        genai = json.loads((d / "genai_verify.json").read_text())
        assert genai["passed"] and genai["tokens_compared"] == [8, 8] and genai["cpu_twin"]["graphs"] == "qdq"
        rec = records(out)[f"llm_genai/llm_tiny@{target}"]  # what the float twin held (PSS) and its peak RSS
        if rec["source"] == "run":  # an entry restored from a cache made before these facts existed has none
            assert 0 < rec["held_float_twin"] <= rec["peak_rss_float_twin"] <= rec["peak_rss"], rec
        assert (d / "cpu_twin" / "genai_config.json").is_file()
        assert wrapper["verification"]["status"] == "passed"
        # the quality gates (defaults): their figures in the manifest, the texts in the report
        quality = wrapper["verification"]["quality"]
        assert quality["thresholds"] == {"max_ppl_ratio": 1.15, "min_agreement": 0.8}, quality
        for backend in ("qdq_cpu", "simulator"):
            assert quality[backend]["ppl_ratio"] <= 1.15 and quality[backend]["agreement"] >= 0.8, quality
        package = next(a for a in manifest["artifacts"] if a["path"] == f"{target}/llm_tiny/genai_config.json")
        assert package["verification"]["status"] == "passed" and "onnxruntime-genai" in package["verification"]["method"]
    report = json.loads((out / "report.json").read_text())
    assert any(o["name"] == "logits@prompt_ar16_cl128_2_of_2" for row in report["rows"] for v in row["verify"]
               for o in v["outputs"])
    checks = {(a["target"], a["graph"]): a["passed"] for a in json.loads(ctxbuild("build", str(tree), "-o", str(out),
                                                                                   "--json").out)["accuracy"]}
    assert checks[("SM8650", "genai_config.json")] is True and checks[("SM8750", "genai_config.json")] is True
    _weights_stored_once(out, RECIPES / "models" / "llama_tiny.onnx")
    # a no-op rebuild runs nothing
    again = ctxbuild("build", str(tree), "-o", str(out))
    assert again.code == 0 and "ctxbuild: up to date" in again.out, again.text
    _covering_checks(tree / "llm_tiny.yaml", out, ctxbuild)


def _covering_checks(recipe: Path, out: Path, ctxbuild) -> None:
    """llm.simulator: covering (what parts over 64 MiB get by default): only the part checks re-run; each compiles and
    runs on the simulator the AR 16 graph at CL 64 and the AR 1 graph at CL 128, one call each, and the CPU runs and
    gates all 4 graphs on every recorded call."""
    recipe.write_text(recipe.read_text().replace("  generate: 8\n", "  generate: 8\n  simulator: covering\n"))
    before = {i: rec.get("build_id") for i, rec in records(out).items()}
    r = ctxbuild("build", str(recipe.parent), "-o", str(out))
    assert r.code == 0, r.text
    ran = sorted(i for i, rec in records(out).items() if rec.get("build_id") != before.get(i))
    assert ran == [f"llm_part_eval/llm_tiny.part{p}@{t}" for p in (1, 2) for t in ("SM8650", "SM8750")], ran
    for target in ("SM8650", "SM8750"):
        for part in (1, 2):
            result = json.loads((out / target / "llm_tiny" / "llm_verify" / f"part{part}_of_2.json").read_text())
            assert result["passed"], result["failures"]
            sim = {g: c["calls"] for cl in result["by_cl"].values() for g, c in cl["simulator"].items() if c["calls"]}
            cpu = {g: c["calls"] for cl in result["by_cl"].values() for g, c in cl["qdq_cpu"].items()}
            assert sim == {f"prompt_ar16_cl64_{part}_of_2": 1, f"token_ar1_cl128_{part}_of_2": 1}, sim
            assert cpu == {f"{k}_cl{cl}_{part}_of_2": n for cl in (64, 128) for k, n in (("prompt_ar16", 2), ("token_ar1", 4))}
            assert f"{'hidden_states.2' if part == 1 else 'logits'}@token_ar1_cl64_{part}_of_2 (QDQ graph on the CPU)" \
                in result["outputs"]
            assert set(records(out)[f"llm_part_eval/llm_tiny.part{part}@{target}"]["simulator_seconds_by_graph"]) == set(sim)


def _weights_stored_once(out: Path, model: Path) -> None:
    """Each part's float graphs and its QDQ graphs (every AR x CL) point into one weight file of their own, and the
    weight files in OUT hold the model's bytes about once: the float copy (+ the tied head folded beside the
    embedding) and the int8 one; 8 graphs with a copy each held 6.6x here."""
    from ctxbuild.graph.modelio import weight_bytes

    work = out / ".ctxbuild" / "work" / "llm"
    dirs = [d for d in work.iterdir() if any(d.glob("*.data"))]  # not the quality figures' or the kept twins'
    assert len(dirs) == 3  # the split, a quantize per part
    for d in dirs:
        for graph in d.glob("*.onnx"):
            part = graph.stem.rsplit("_", 3)[-3]
            files = external_data_files(onnx.load(graph, load_external_data=False), graph)
            assert set(files) == {f"external:weights_{part}_of_2.data"}, (graph, files)
    held = sum(f.stat().st_size for f in work.rglob("*.data"))
    assert held <= 2 * weight_bytes(model), (held, weight_bytes(model))


def test_w4a16_puts_int4_weights_in_the_part_models(decoder: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    r = ctxbuild("build", str(_recipe(tmp_path / "r", decoder, precision="w4a16", context_lengths=[24])), "-o", str(out),
                 "--no-verify")
    assert r.code == 0, r.text
    quantized = sorted((out / ".ctxbuild" / "work" / "llm").glob("llama-q*/*.onnx"))
    assert len(quantized) == 4
    for q in quantized:
        types = {t.name: t.data_type for t in onnx.load(q).graph.initializer}
        int4 = [n for n, t in types.items() if t == TensorProto.INT4]
        int8 = [n for n, t in types.items() if t == TensorProto.INT8]
        # the embedding / LM head and, by default, the first and last blocks (layers 0 and 2 of 3) stay 8-bit
        assert not any(n.startswith(("model.embed_tokens", "model.layers.0.", "model.layers.2.")) for n in int4)
        if "_1_of_2" in q.name:  # layers 0-1: layer 1's projections in int4, layer 0's in int8
            assert any("layers.1.self_attn.q_proj" in n for n in int4) and any("layers.1.mlp.down_proj" in n for n in int4)
            assert any("layers.0.mlp.down_proj" in n for n in int8)
        else:
            assert any("layers.2.mlp.down_proj" in n for n in int8)
    assert (out / "SM8650" / "llama" / "llama_1_of_2_qnn.bin").stat().st_size > 0


@pytest.mark.parametrize("gates, takes", [({"max_ppl_ratio": 1000, "min_agreement": 0}, "w4a16 block 32"),
                                          ({"max_ppl_ratio": 1, "min_agreement": 1}, "w8a16 per channel")])
def test_precision_auto_judges_candidates_in_the_model_by_the_quality_gates(decoder: Path, tmp_path: Path, ctxbuild,
                                                                          gates: dict[str, float], takes: str) -> None:
    """With the part checks' gates open, the quality gates alone choose: each part's candidate is run in the float
    model (llm_float_eval's text and prompts) against its share of them; even --no-verify builds judge so."""
    out = tmp_path / "out"
    loose = {"min_cosine": -1, "min_token_agreement": 0, "min_kv_cosine": -1}
    r = ctxbuild("build", str(_recipe(tmp_path / "r", decoder, precision="auto", context_lengths=[24], **loose,
                                      **gates)), "-o", str(out), "--no-verify")
    assert r.code == 0, r.text
    for part in (1, 2):
        log = next((out / ".ctxbuild" / "logs").glob(f"llm_quantize.llama.part{part}-*.log")).read_text()
        assert f"precision auto: part {part} takes {takes}" in log, log
        record = json.loads(next((out / ".ctxbuild" / "records").glob(f"llm_quantize*part{part}-*.json")).read_text())
        first = record["auto"]["candidates"][0]
        assert first["quality"]["tokens"] > 0 and first["quality"]["steps"] > 0, first
        # the first candidate (int4) keeps neither the float's perplexity nor all its tokens on random weights: the
        # tight gates fail it (its ratio here was 0.75, under the float's; the agreement failed)
        q = first["quality"]
        within = q["ppl_ratio"] <= gates["max_ppl_ratio"] and q["agreement"] >= gates["min_agreement"]
        assert first["passed"] == within == (takes == first["name"]), first


def test_genai_convention_model_builds_and_verifies(decoder: Path, tmp_path: Path, ctxbuild) -> None:
    """onnxruntime-genai's model-builder convention (GroupQueryAttention, SkipSimplifiedLayerNormalization):
    rewritten into HTP ops, compiled, and verified token by token like the optimum export of the same weights."""
    out = tmp_path / "out"
    r = ctxbuild("build", str(_recipe(tmp_path / "r", decoder, model=str(decoder / "llama_genai.onnx"),
                                      context_lengths=[24])), "-o", str(out))
    assert r.code == 0, r.text
    for part in (1, 2):
        result = json.loads((out / "SM8650" / "llama" / "llm_verify" / f"part{part}_of_2.json").read_text())
        assert result["passed"] and all(m["cosine"] >= 0.95 for m in result["outputs"].values()), result
    assert len(list((out / "SM8650" / "llama").glob("*_ctx.onnx"))) == 4


def test_a_failing_part_names_its_graph_and_output(decoder: Path, tmp_path: Path, ctxbuild) -> None:
    """A part under the thresholds fails the build (exit 1) with one line naming the part, graph, output and figures;
    its bundle is set aside (ship_only_verified), the summary's row for that part says FAILED."""
    out = tmp_path / "out"
    r = ctxbuild("build", str(_recipe(tmp_path / "r", decoder, context_lengths=[24], min_cosine=0.999999,
                                      min_agreement=1.0)), "-o", str(out))
    assert r.code == 1, r.text
    _quality_failed(r, out)
    for part in (1, 2):
        line = next(x for x in r.err.splitlines() if x.startswith(f"ctxbuild: FAILED llm_part_eval/llama.part{part}@SM8650"))
        assert f"llama@SM8650: part {part} of 2: graph prompt_ar8_cl24_{part}_of_2, output " in line, line
        if part == 1:  # the residual stream at the cut, which the static pass renames: the export's name too
            assert "output hidden_states.2 (the export's '/model/layers." in line, line
        cosine = float(line.split("simulator cosine ")[1].split()[0])  # as many digits as show it under the floor
        assert cosine < 0.999999 and "(min 0.999999), SNR " in line and " dB over 2 calls" in line, line
        assert not (out / "SM8650" / "llama" / f"llama_{part}_of_2_qnn.bin").exists()
        assert (out / ".ctxbuild" / "failed" / "SM8650" / "llama" / f"llama_{part}_of_2_qnn.bin").is_file()
        rows = [x for x in r.out.splitlines() if f"part {part} of 2 CL 24" in x]
        assert len(rows) == 1 and "FAILED" in rows[0], r.out
    record = records(out)["llm_part_eval/llama.part2@SM8650"]
    assert record["status"] == "failed" and not record["result"]["passed"]
    assert any("output logits: simulator cosine" in f for f in record["result"]["failures"]), record["result"]


def _quality_failed(r: object, out: Path) -> None:
    """The quality gates (min_agreement 1.0) fail the build like any verification: one line
    naming the backend, figure and gate; the row says FAILED with the figures; report.json has each prompt's float
    and QDQ continuation side by side (ids: this decoder has no tokenizer)."""
    line = next(x for x in r.err.splitlines() if x.startswith("ctxbuild: FAILED llm_quality/llama@SM8650"))
    assert "QDQ parts on the CPU: greedy agreement 0." in line and "(min 1.0) over " in line and " steps" in line, line
    row = next(x for x in r.out.splitlines() if "FAILED (CPU ppl " in x)
    assert "max 1.15x, min 1.0)" in row and " quality " in row, r.out
    report = json.loads((out / "report.json").read_text())
    [v] = {v["id"]: v for row in report["rows"] for v in row["verify"] if v["graph"] == "quality"}.values()
    q = v["quality"]
    assert q["float"]["text"].startswith("the verification prompts' token ids"), q["float"]
    assert q["qdq_cpu"]["segments"] >= 1 and q["simulator"]["segments"] == 1 and q["simulator"]["steps"] <= 8 and q["simulator"]["tokens"] == 7, q
    assert q["qdq_cpu"]["steps"] == sum(t["float_tokens"] for t in q["texts"]) and len(q["texts"]) == 2, q
    assert all(isinstance(t["qdq_cpu"], list) and t["float"] is None for t in q["texts"]), q["texts"]
    # failing, the CPU chain ran again with the activations in float, and the hint says which side lost the model
    alone = q["qdq_cpu"]["weights_alone"]
    assert (alone["tokens"], alone["steps"]) == (q["qdq_cpu"]["tokens"], q["qdq_cpu"]["steps"]), q["qdq_cpu"]
    assert f"with the activations in float the QDQ parts read {alone['ppl_ratio']:.3f}x, agreement " in r.err, r.err
    manifest = json.loads((out / "manifest.json").read_text())
    verdicts = [a["verification"] for a in manifest["artifacts"] if (a.get("verification") or {}).get("quality")]
    assert not verdicts, verdicts  # what it verified is set aside (ship_only_verified), the config too
    assert not (out / "SM8650" / "llama" / "genai_config.json").exists()


def _rotary_style(path: Path) -> None:
    """A decoder whose attention is com.microsoft MultiHeadAttention + RotaryEmbedding (not rewritten)."""
    f = TensorProto.FLOAT
    node = helper.make_node("RotaryEmbedding", ["q", "past_key_values.0.key", "past_key_values.0.value"],
                            ["o", "present.0.key", "present.0.value"], domain="com.microsoft")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("q", f, [1, 1, 64]),
                                        helper.make_tensor_value_info("past_key_values.0.key", f, [1, 2, "p", 16]),
                                        helper.make_tensor_value_info("past_key_values.0.value", f, [1, 2, "p", 16])],
                          [helper.make_tensor_value_info("o", f, [1, 1, 64])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]), path)


@pytest.mark.parametrize("case,llm,expect", [
    ("cl_not_above_ar", {"context_lengths": [8]}, "context length 8 is not larger than sequence length 8"),
    ("too_many_parts", {"parts": 4}, "4 parts for a model of 3 layers"),
    ("contrib_attention", {"model": "ROTARY"}, "the model uses RotaryEmbedding, which ctxbuild cannot rewrite"),
    ("not_a_decoder", {"model": "CNN"}, "not a decoder in the optimum or onnxruntime-genai convention"),
    ("int4_on_v68", {"precision": "w4a16", "TARGET": "SM8350"}, "w4a16 on SM8350 (htp_arch below v73): its weights are measured only on v73 and newer"),
    ("kv_with_fp16", {"precision": "fp16", "kv_cache": "uint8"}, "kv_cache sets a quantized type"),
    ("budget_no_split_meets", {"parts": None, "part_max_mb": 0.01}, "part_max_mb 0.01: even one layer per part needs"),
    ("budget_and_parts", {"part_max_mb": 1}, "give parts or part_max_mb, not both"),
    ("keep_8bit_with_w8a16", {"keep_8bit": ["*.down_proj.*"]}, "keep_8bit keeps weights of a w4a16 model at int8"),
    ("keep_8bit_matches_nothing", {"precision": "w4a16", "keep_8bit": ["*.nothing.*"]}, "'*.nothing.*' matches no weight"),
])
def test_bad_llm_recipes_exit_2_with_one_line(decoder: Path, tmp_path: Path, ctxbuild, case: str,
                                             llm: dict[str, object], expect: str) -> None:
    llm = dict(llm)
    if llm.get("model") == "ROTARY":
        _rotary_style(tmp_path / "rotary.onnx")
        llm["model"] = str(tmp_path / "rotary.onnx")
    elif llm.get("model") == "CNN":
        subprocess.run([sys.executable, str(RECIPES / "models" / "make_models.py"), str(tmp_path / "m")], check=True)
        llm["model"] = str(tmp_path / "m" / "tiny_cnn.onnx")
    target = llm.pop("TARGET", None)

    f = _recipe(tmp_path / "r", decoder, **llm)
    if target:
        f.write_text(f.read_text().replace('"SM8650"', f'"{target}"'))
    r = ctxbuild("build", str(f), "-o", str(tmp_path / "out"))
    assert r.code == 2, r.text
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and expect in lines[0] and "llama.yaml:" in lines[0], r.err


def test_a_part_budget_chooses_the_fewest_parts_that_fit(decoder: Path, tmp_path: Path) -> None:
    from ctxbuild.llm.convention import decoder_facts
    from ctxbuild.recipes.llm import part_weight_bytes
    from ctxbuild.recipes import recipe

    facts = decoder_facts(decoder / "llama.onnx")
    assert facts is not None
    one, two = (part_weight_bytes(facts, n, "w8a16", None) for n in (1, 2))
    # the whole model's matrices, at one byte each, with the tied embedding in both end parts
    assert one[0] == sum(e for _, e, _ in facts["weight_sizes"]) and sum(two) == one[0]
    budget = (max(two) + one[0]) / 2 / 1e6  # fits two parts, not one
    (r,) = recipe.load([_recipe(tmp_path / "r", decoder, parts=None, part_max_mb=budget)]).recipes
    assert r.llm is not None and r.llm.parts == 2


def test_hard_linked_external_data_is_read_from_a_copy(decoder: Path, tmp_path: Path) -> None:
    """onnx refuses external data with a second hard link (`cp -al`, a dedup tool): the split reads such a
    model from copies, as it does a symlinked one (it failed with onnx's "multiple hard links")."""
    from ctxbuild.actions.llm_split import readable

    src = tmp_path / "given"
    src.mkdir()
    onnx.save(onnx.load(decoder / "llama.onnx"), src / "llama.onnx", save_as_external_data=True,
              location="llama.onnx.data", size_threshold=0)
    os.link(src / "llama.onnx.data", tmp_path / "elsewhere.data")
    copy = readable(src / "llama.onnx", tmp_path / "source")
    assert copy == tmp_path / "source" / "llama.onnx" and (copy.parent / "llama.onnx.data").stat().st_nlink == 1
    assert len(onnx.load(str(copy)).graph.initializer) == len(onnx.load(decoder / "llama.onnx").graph.initializer)


def test_large_parts_run_one_recorded_call_per_covering_graph_on_the_simulator() -> None:
    """Above SUBSET_ABOVE bytes of QDQ weights the simulator runs one call on each graph that covers an AR and a CL:
    the largest AR's last prefill window at the smallest CL, AR 1's first token step at the next (the CPU runs them
    all); small parts and fp16 run every call."""
    from ctxbuild.actions.llm_part_eval import SUBSET_ABOVE, covering_graphs, on_simulator
    from ctxbuild.llm.records import Call

    calls = [Call(0, ar, cl, past, valid, {}, {}) for cl in (64, 128)
             for ar, past, valid in ((16, 0, 16), (16, 16, 4), (1, 20, 1), (1, 21, 1), (1, 18, 1), (1, 19, 1))]
    assert list(on_simulator(calls, "w8a16", SUBSET_ABOVE - 1)) == list(range(12))
    assert list(on_simulator(calls, "fp16", 10 * SUBSET_ABOVE)) == list(range(12))
    assert list(on_simulator(calls, "w4a16", SUBSET_ABOVE)) == [1, 8]
    # llm.simulator: the policy whatever the size; fp16 always every call
    assert list(on_simulator(calls, "w8a16", 1, "covering")) == [1, 8]
    assert list(on_simulator(calls, "w8a16", 10 * SUBSET_ABOVE, "all")) == list(range(12))
    assert list(on_simulator(calls, "fp16", 1, "covering")) == list(range(12))
    assert covering_graphs({128, 1}, {1024, 2048}) == {(128, 1024), (1, 2048)}
    assert covering_graphs({128, 64, 1}, {1024}) == {(128, 1024), (64, 1024), (1, 1024)}
    assert covering_graphs({128, 1}, {512, 1024, 2048}) == {(128, 512), (1, 1024), (1, 2048)}
    assert covering_graphs({1}, {256}) == {(1, 256)}


def test_part_check_gates_the_cpu_on_graphs_the_simulator_skipped() -> None:
    """Graphs the simulator did not run are shown and gated by the QDQ graph on the CPU: a loss there fails the part,
    named with the backend."""
    from ctxbuild.actions.llm_part_eval import _result
    from ctxbuild.llm.records import Call
    from ctxbuild.llm.static import GraphSpec

    rng = np.random.default_rng(0)
    mine = {(ar, cl): GraphSpec(f"{'prompt' if ar > 1 else 'token'}_ar{ar}_cl{cl}_1_of_2", 0, ar, cl)
            for ar in (16, 1) for cl in (64, 128)}
    calls = [Call(0, ar, cl, 0, ar, {}, {"hidden_states.2": rng.standard_normal((ar, 8)).astype(np.float32)})
             for cl in (64, 128) for ar in (16, 1)]
    same = {i: dict(c.outputs) for i, c in enumerate(calls)}
    sim = {i: o for i, o in same.items() if (calls[i].ar, calls[i].cl) in {(16, 64), (1, 128)}}
    cpu = {**same, 1: {"hidden_states.2": -calls[1].outputs["hidden_states.2"]}}  # AR 1 at CL 64: simulator skipped it
    p = {"part": 0, "parts": 2, "precision": "w8a16", "prompts": 1, "simulator": "covering",
         "thresholds": {"min_cosine": 0.95, "min_token_agreement": 0.75}}
    result = _result(p, mine, calls, {"simulator": sim, "qdq_cpu": cpu})
    assert not result["passed"]
    assert result["failures"] == ["graph token_ar1_cl64_1_of_2, output hidden_states.2: QDQ graph on the CPU cosine "
                                  "-1.0000 (min 0.95), SNR -6.0 dB over 1 call"], result["failures"]
    # shown: every gated backend's figures of each graph it ran (the CPU gated on all four, the simulator on two)
    assert set(result["outputs"]) == {"hidden_states.2@prompt_ar16_cl64_1_of_2", "hidden_states.2@token_ar1_cl128_1_of_2",
                                      *(f"hidden_states.2@{g.name} (QDQ graph on the CPU)" for g in mine.values())}
    assert result["by_cl"]["64"]["simulator"]["token_ar1_cl64_1_of_2"]["calls"] == 0
    assert _result(p, mine, calls, {"simulator": sim, "qdq_cpu": same})["passed"]


def test_a_part_row_shows_only_gated_figures_and_a_bad_kv_output_fails() -> None:
    """A part's verdict and its summary row agree: every output the row shows is gated, a KV output at its own floor
    (min_kv_cosine). A part whose hidden states pass while a layer's KV is at cosine ~0.15 (SmolLM2-135M's part 1 at
    w8a16 read "ok" at 0.1460 / -16.2 dB before KV was gated) fails, and the summary row says FAILED; a KV output between
    min_kv_cosine and min_cosine passes and the row names the floor it met."""
    from ctxbuild.actions.llm_part_eval import _result
    from ctxbuild.llm.records import Call
    from ctxbuild.llm.static import GraphSpec
    from ctxbuild.outputs import summary
    from ctxbuild.outputs.report import _verify

    rng = np.random.default_rng(1)
    mine = {(ar, 64): GraphSpec(f"{'prompt' if ar > 1 else 'token'}_ar{ar}_cl64_1_of_2", 0, ar, 64) for ar in (16, 1)}
    calls = [Call(0, ar, 64, 0, ar, {}, {n: rng.standard_normal((ar, 32)).astype(np.float32)
                                         for n in ("hidden_states.2", "present.0.key", "present.1.value")})
             for ar in (16, 1)]
    p = {"part": 0, "parts": 2, "precision": "w8a16", "prompts": 1, "simulator": "all",
         "thresholds": {"min_cosine": 0.95, "min_token_agreement": 0.75, "min_kv_cosine": 0.8}}

    def run(kv_noise: float) -> tuple[dict, dict]:
        sim = {}
        for i, c in enumerate(calls):
            v = c.outputs["present.1.value"]
            sim[i] = {**c.outputs, "present.1.value": v + kv_noise * rng.standard_normal(v.shape).astype(np.float32)}
        result = _result(p, mine, calls, {"simulator": sim, "qdq_cpu": sim})
        v = _verify({"id": "llm_part_eval/x.part1@SM8650", "kind": "llm_part_eval", "outputs": []},
                    {"result": result}, "ok" if result["passed"] else "failed")
        [row] = summary.accuracy([{"recipe": "x", "target": {"name": "SM8650"}, "verify": [v]}])
        return result, row

    result, row = run(6.5)  # cosine ~0.15
    assert not result["passed"] and row["cosine"] < 0.3, row
    assert any("output present.1.value: simulator cosine 0.1" in f and "(min 0.8)" in f for f in result["failures"]), result
    assert summary._verdict(row).startswith("FAILED"), summary._verdict(row)
    shown = {k: m["cosine"] for k, m in result["outputs"].items()}
    assert min(shown.values()) == row["cosine"] and "present.1.value@token_ar1_cl64_1_of_2" in shown, shown
    result, row = run(0.6)  # cosine ~0.86: under min_cosine, over min_kv_cosine
    assert result["passed"] and 0.8 < row["cosine"] < 0.95, (result["failures"], row)
    assert summary._verdict(row) == "ok (KV min cosine 0.8)"
    result, row = run(0.0)
    assert result["passed"] and summary._verdict(row) == "ok"
