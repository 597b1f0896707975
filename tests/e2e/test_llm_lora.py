"""LoRA adapters on an `llm:` recipe (recipes/llm_lora.yaml): one base per part and target, the slots kept as inputs
of each part's graphs, one `.onnx_adapter` per graph and adapter holding exactly that graph's slots, each adapter
verified token by token; an application binding the shipped files on the simulator gets the float model with that
adapter; an adapter change re-runs only its files and its verification; bad `llm.adapters` exit 2 naming the line."""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from tests._adapters import adapter_values, merged_model
from tests.conftest import RECIPES, keep_only, last_build
from tests._qnn_models import qnn_session

sys.path.insert(0, str(RECIPES / "models"))
import llm_decoder  # noqa: E402 - the example generator, a script beside the recipes

GRAPHS = [f"{k}_cl64_{p}_of_2" for p in (1, 2) for k in ("prompt_ar16", "token_ar1")]
ADAPTERS = ("chat", "summarize")


@pytest.fixture
def lora(tree: Path) -> Path:
    shutil.copy(RECIPES / "llm_lora.yaml", tree)  # the tree fixture leaves the LLM examples out
    keep_only(tree, "llm_lora.yaml")
    return tree / "llm_lora.yaml"


def simulate(twins: Path, bindings: Path, prompt: np.ndarray, forced: list[int], adapter: str | None) -> list[np.ndarray]:
    """Teacher-forced logits of the part twins on the simulator, as an application runs them: the adapter's shipped
    .onnx_adapter per graph bound with RunOptions.add_active_adapter (none: the base)."""
    from ctxbuild.llm import pipeline

    sessions, keep = {}, []

    def run(part: int, ar: int, cl: int, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        name = GRAPHS[part * 2 + (ar == 1)]
        if name not in sessions:
            ro = None
            if adapter:
                lora = ort.LoraAdapter()
                lora.Load(str(bindings / f"{name}.{adapter}.onnx_adapter"))
                ro = ort.RunOptions()
                ro.add_active_adapter(lora)
                keep.append(lora)
            sessions[name] = (qnn_session(twins / f"{name}_ctx.onnx"), ro)
        s, ro = sessions[name]
        return dict(zip([o.name for o in s.get_outputs()], s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()}, ro)))

    cfg = llm_decoder.Config(lora_rank=4)
    return pipeline.generate(run, [(0, 2), (2, 4)], (cfg.kv_heads, cfg.head_dim), prompt, len(forced), 64, 16,
                             forced=forced).logits


def genai_runs_the_base(out: Path, prompt: np.ndarray, want: list[int]) -> None:
    """onnxruntime-genai runs the CPU twin the LoRA recipe's build writes (cpu_twin/: the shipped config with the
    float static graphs, slots and all, in place of the wrappers) and decodes the base model's tokens."""
    import onnxruntime_genai as og

    model = og.Model(str(out / "SM8650" / "llm_lora" / "cpu_twin"))
    gen = og.Generator(model, og.GeneratorParams(model))
    gen.append_tokens(prompt.astype(np.int32))
    for _ in want:
        gen.generate_next_token()
    assert [int(t) for t in gen.get_sequence(0)[-len(want):]] == want


def error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Mean relative L2 error of the logits per step."""
    return float(np.mean([np.linalg.norm(g - w) / np.linalg.norm(w) for g, w in zip(got, want)]))


def cosines(a: list[np.ndarray], b: list[np.ndarray]) -> list[float]:
    return [float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b)]


def test_adapters_bind_per_graph_verified_and_rebuild_alone(lora: Path, tree: Path, tmp_path: Path, ctxbuild) -> None:
    from ctxbuild.llm import pipeline

    out = tmp_path / "out"
    r = ctxbuild("build", str(lora), "-o", str(out))
    assert r.code == 0, r.text
    d = out / "SM8650" / "llm_lora"
    # each graph's files bind exactly that graph's slots: the wrapper's optional inputs (its layers' LoRA weights)
    for g in GRAPHS:
        wrapper = onnx.load(d / f"{g}_ctx.onnx", load_external_data=False)
        optional = {t.name for t in wrapper.graph.initializer} & {i.name for i in wrapper.graph.input}
        layers = (0, 1) if g.endswith("1_of_2") else (2, 3)
        lora_slots = {f"model.layers.{i}.self_attn.{p}.lora_{ab}.weight" for i in layers for p in ("q_proj", "v_proj")
                      for ab in "AB"}
        assert optional == lora_slots | {"lora_scaling"}, g
        for name in ADAPTERS:  # the files set A and B; `lora_scaling` keeps the base's alpha / rank
            assert set(adapter_values(d / "adapters" / f"{g}.{name}.onnx_adapter")) == lora_slots
    manifest = json.loads((out / "manifest.json").read_text())
    rows = [a for a in manifest["adapters"] if a["recipe"] == "llm_lora"]
    assert sorted((a["name"], a["binds"]["graph"]) for a in rows) == sorted((n, g) for n in ADAPTERS for g in GRAPHS)
    for name in ADAPTERS:
        result = json.loads((d / "adapters" / f"{name}_llm_verify.json").read_text())
        sim = result["by_cl"]["64"]["simulator"]
        assert result["passed"] and result["adapter"] == name and result["calibrated"] == (name == "chat")
        assert sim["steps"] == 16 and sim["token_agreement"] >= 0.75 and sim["cosine_mean"] >= 0.99, sim
        assert result["by_cl"]["64"]["tokens_changed_by_adapter"] > 0.2  # it changes the model's continuation
        # the calibrated adapter stays inside the encodings; the other one leaves some (named per graph)
        clipping = result["clipping"]
        assert (not clipping) if name == "chat" else clipping and {c["graph"] for c in clipping} <= set(GRAPHS)
        for row in (a for a in rows if a["name"] == name):
            assert row["verification"]["status"] == "passed" and row["verification"]["tokens_by_cl"] == result["by_cl"]

    # An application's view, independent of llm_eval: the twins on the simulator with the shipped files bound
    # against the original decoder with the adapter file merged in (teacher-forced on its greedy tokens).
    from safetensors.numpy import load_file

    twins = out / ".ctxbuild" / "work" / "llm" / "twins" / "SM8650" / "llm_lora"
    base = tree / "models" / "llama_lora.onnx"
    prompt = np.load(sorted((tree / "models" / "prompts" / "llama_tiny").glob("*.npy"))[0])
    plain = pipeline.reference_generate(base, prompt, 8)
    without = simulate(twins, d / "adapters", prompt, plain.tokens, None)
    assert np.mean(cosines(without, plain.logits)) > 0.99
    for name in ADAPTERS:
        want = pipeline.reference_generate(
            merged_model(base, load_file(str(tree / "models" / "adapters" / "llama_lora" / f"{name}.safetensors")),
                   tmp_path / f"{name}.onnx"), prompt, 8)
        assert want.tokens != plain.tokens  # the adapter changes the float model's continuation
        got = simulate(twins, d / "adapters", prompt, want.tokens, name)
        agree = np.mean([int(g.argmax()) == t for g, t in zip(got, want.tokens)])
        assert np.mean(cosines(got, want.logits)) > 0.99 and agree >= 0.75, (name, cosines(got, want.logits), agree)
        # the same history without the adapter is much further from the adapter's float logits: it was bound
        unbound = simulate(twins, d / "adapters", prompt, want.tokens, None)
        assert error(unbound, want.logits) > 2 * error(got, want.logits), (name, error(unbound, want.logits),
                                                                          error(got, want.logits))

    genai_runs_the_base(out, prompt, plain.tokens)

    # an adapter outside the calibration set changes: its files and its verification run, nothing else
    summarize = tree / "models" / "adapters" / "llama_lora" / "summarize.safetensors"
    from safetensors.numpy import save_file

    values = load_file(str(summarize))
    save_file({k: v * 0.7 if "lora_B" in k else v for k, v in values.items()}, str(summarize))
    r = ctxbuild("build", str(lora), "-o", str(out), "--explain")
    assert r.code == 0, r.text
    own = {f"adapter/llm_lora.{g}+summarize@SM8650" for g in GRAPHS} | {"llm_eval/llm_lora+summarize@SM8650"}
    assert set(last_build(out)) == own, last_build(out)
    assert f"explain: adapter/llm_lora.{GRAPHS[0]}+summarize@SM8650: ran: not in cache; changed: inputs (adapter)" in r.text

    # a new adapter (outside `calibrate`) with `scale:`: its own actions only; each of its files sets the scaling slot
    shutil.copy(summarize, summarize.with_name("terse.safetensors"))
    lora.write_text(lora.read_text().replace("      - {name: summarize,", "      - {name: terse, file: "
                                             "models/adapters/llama_lora/terse.safetensors, scale: 1.0}\n      - {name: summarize,"))
    r = ctxbuild("build", str(lora), "-o", str(out))
    assert r.code == 0, r.text
    assert set(last_build(out)) == {f"adapter/llm_lora.{g}+terse@SM8650" for g in GRAPHS} | {"llm_eval/llm_lora+terse@SM8650"}
    for g in GRAPHS:
        assert adapter_values(d / "adapters" / f"{g}.terse.onnx_adapter")["lora_scaling"].tolist() == [1.0]

    # a tensor in the file that matches no slot of any graph: the adapter's own actions fail, naming it
    time.sleep(0.01)
    save_file({**values, "model.layers.0.self_attn.k_proj.lora_A.weight": values[
        "model.layers.0.self_attn.q_proj.lora_A.weight"]}, str(summarize))
    r = ctxbuild("build", str(lora), "-o", str(out))
    assert r.code == 1
    assert "tensor 'model.layers.0.self_attn.k_proj.lora_A.weight' matches no adapter slot" in r.text, r.text
    assert "summarize.safetensors" in r.text and not any(a.startswith(("bundle/", "llm_quantize/")) for a in last_build(out))

    # an adapter of the calibration set changes: the parts are re-quantized and recompiled
    save_file(values, str(summarize))
    chat = tree / "models" / "adapters" / "llama_lora" / "chat.safetensors"
    save_file({k: v * 0.7 if "lora_B" in k else v for k, v in load_file(str(chat)).items()}, str(chat))
    r = ctxbuild("build", str(lora), "-o", str(out))
    assert r.code == 0, r.text
    ran = set(last_build(out))
    assert {"llm_quantize/", "bundle/"} <= {a.split("/")[0] + "/" for a in ran} and not any(
        a.startswith("llm_split/") for a in ran)


@pytest.mark.parametrize("case,edit,expect", [
    ("slot_names_nothing", ('"*.lora_B.weight"]', '"*.lora_B.weight", "*.o_proj.lora_A.weight"]'),
     "llm_lora.yaml:14: '*.o_proj.lora_A.weight' names no initializer or input of llama_lora.onnx"),
    ("scaling_names_nothing", ("scaling: lora_scaling", "scaling: lora_alpha"),
     "llm_lora.yaml:15: 'lora_alpha' names no initializer or input of llama_lora.onnx"),
    ("with_fp16", ("precision: w8a16", "precision: fp16"), "llm_lora.yaml:13: llm.adapters with precision fp16"),
    ("unknown_calibrate", ("calibrate: [chat]", "calibrate: [chatty]"),
     "llm_lora.yaml:16: 'chatty' is not an adapter of this recipe"),
    ("missing_file", ("chat.safetensors", "gone.safetensors"), "llm_lora.yaml:18: adapter 'chat': file"),
    ("top_level", ("  adapters:\n", "adapters:\n"), "`adapters` does not apply to an `llm:` recipe"),
])
def test_bad_llm_adapters_exit_2_naming_the_line(lora: Path, tmp_path: Path, ctxbuild, case: str,
                                                edit: tuple[str, str], expect: str) -> None:
    text = lora.read_text()
    assert edit[0] in text
    if case == "top_level":  # the block moved out of llm: (dedented)
        head, block = text.split("  adapters:\n")
        block, tail = block.split("targets:")
        text = head + "adapters:\n" + "".join(line[2:] + "\n" for line in block.splitlines()) + "targets:" + tail
    else:
        text = text.replace(*edit)
    lora.write_text(text)
    r = ctxbuild("build", str(lora), "-o", str(tmp_path / "out"))
    assert r.code == 2, r.text
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert expect in lines[0] and "llm_lora.yaml:" in lines[0], r.err


def test_static_graphs_keep_each_parts_slots_and_decode_the_merged_model(tmp_path: Path) -> None:
    """The rewrite with slots: each part's graphs take its layers' slots as inputs (defaults inside), and fed an
    adapter's values they decode the original decoder with that adapter merged in (CPU, float)."""
    from ctxbuild.llm import pipeline, static

    cfg = llm_decoder.Config(layers=3, max_positions=128, lora_rank=4)
    # weights in external data, as large exports come: the split reads the slots' defaults from there
    onnx.save(llm_decoder.decoder(cfg), tmp_path / "lora.onnx", save_as_external_data=True, size_threshold=1024,
              location="lora.onnx.data")
    graphs = static.specs(2, [8, 1], [32])
    dst = {g.name: tmp_path / f"{g.name}.onnx" for g in graphs}
    slots = {"patterns": ["*.lora_A.weight", "*.lora_B.weight"], "scaling": "lora_scaling"}
    weights = [tmp_path / static.weights_name(p, 2) for p in range(2)]
    shape = static.write_static_graphs(tmp_path / "lora.onnx", 2, [8, 1], [32], dst, weights, slots)
    for g in graphs:
        m = onnx.load(dst[g.name])
        optional = {t.name for t in m.graph.initializer} & {i.name for i in m.graph.input}
        layers = range(0, 2) if g.part == 0 else range(2, 3)
        assert optional == {f"model.layers.{i}.self_attn.{p}.lora_{ab}.weight" for i in layers
                            for p in ("q_proj", "v_proj") for ab in "AB"} | {"lora_scaling"}, g.name
    weights = llm_decoder.lora_adapter(cfg, 7, b_std=0.05)
    ranges = static.part_ranges(shape.layers, 2)
    models = {(g.part, g.ar, g.cl): dst[g.name] for g in graphs}
    # each graph fed its own layers' values (model.layers.N....), as the per-graph .onnx_adapter files hold them
    bound = {k: {n: v for n, v in weights.items() if ranges[k[0]][0] <= int(n.split(".")[2]) < ranges[k[0]][1]}
             for k in models}
    prompt = llm_decoder.prompts(cfg, 1, 11)[0]
    want = pipeline.reference_generate(merged_model(tmp_path / "lora.onnx", weights, tmp_path / "merged.onnx"), prompt, 8)
    got = pipeline.generate(pipeline.cpu_runner(models, bound), ranges, (shape.kv_heads, shape.head_dim), prompt, 8, 32, 8)
    assert got.tokens == want.tokens
    assert max(float(np.abs(a - b).max()) for a, b in zip(got.logits, want.logits)) < 1e-3
    plain = pipeline.generate(pipeline.cpu_runner(models), ranges, (shape.kv_heads, shape.head_dim), prompt, 8, 32, 8)
    assert plain.tokens == pipeline.reference_generate(tmp_path / "lora.onnx", prompt, 8).tokens != want.tokens


def test_slots_exported_as_inputs_default_to_zeros(tmp_path: Path) -> None:
    """A decoder exported with its LoRA weights as graph inputs (fixed shapes): the graphs keep them, defaulting to
    zeros (no adapter), and decode as the original does fed zeros."""
    from ctxbuild.llm import pipeline, static

    cfg = llm_decoder.Config(layers=2, max_positions=128, lora_rank=4)
    model = llm_decoder.decoder(cfg)
    lora = [t for t in model.graph.initializer if ".lora_" in t.name]
    for t in lora:
        model.graph.initializer.remove(t)
        model.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    onnx.save(model, tmp_path / "inputs.onnx")
    graphs = static.specs(1, [8, 1], [32])
    dst = {g.name: tmp_path / f"{g.name}.onnx" for g in graphs}
    shape = static.write_static_graphs(tmp_path / "inputs.onnx", 1, [8, 1], [32], dst, [tmp_path / "weights.data"],
                                       {"patterns": ["*lora*"], "scaling": None})
    m = onnx.load(dst["token_ar1_cl32_1_of_1"])
    defaults = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if ".lora_" in t.name}
    assert set(defaults) == {t.name for t in lora} and not any(v.any() for v in defaults.values())
    prompt = llm_decoder.prompts(cfg, 1, 11)[0]
    want = pipeline.reference_generate(tmp_path / "inputs.onnx", prompt, 6, defaults)
    got = pipeline.generate(pipeline.cpu_runner({(0, g.ar, g.cl): dst[g.name] for g in graphs}), [(0, 2)],
                            (shape.kv_heads, shape.head_dim), prompt, 6, 32, 8)
    assert got.tokens == want.tokens


def test_adapter_actions_only_for_the_parts_holding_slots(tmp_path: Path) -> None:
    """Slots on layer 0 only: part 2's graphs get no adapter files; the adapter evaluations do not verify the bundles
    (they read the twins and the files), and only the `calibrate` adapters are quantize inputs."""
    from ctxbuild.plan.planner import make_plan
    from ctxbuild.recipes import recipe

    d = tmp_path / "r"
    (d / "models" / "adapters").mkdir(parents=True)
    cfg = llm_decoder.Config(layers=2, max_positions=128, lora_rank=4)
    onnx.save(llm_decoder.decoder(cfg), d / "models" / "lora.onnx")
    (d / "prompts").mkdir()
    for name in ADAPTERS:
        np.savez(d / "models" / "adapters" / f"{name}.npz", **llm_decoder.lora_adapter(cfg, 1))
    (d / "llm.yaml").write_text(json.dumps({"llm": {
        "model": "models/lora.onnx", "sequence_lengths": [8, 1], "context_lengths": [32], "parts": 2,
        "precision": "w8a16", "prompts": {"dir": "prompts"},
        "adapters": {"slots": ["model.layers.0.*lora*"], "calibrate": ["chat"],
                     "files": [{"name": n, "file": f"models/adapters/{n}.npz"} for n in ADAPTERS]}},
        "targets": ["SM8650"]}))
    plan = make_plan(recipe.load([d]), tmp_path / "out")
    acts = {a.id: a for a in plan.actions}
    bound = sorted(a.params["graph"] for a in acts.values() if a.kind == "adapter")
    assert bound == sorted(["prompt_ar8_cl32_1_of_2", "token_ar1_cl32_1_of_2"] * 2)
    evals = [i for i in acts if i.startswith("llm_eval/llm+")]
    assert sorted(evals) == ["llm_eval/llm+chat@SM8650", "llm_eval/llm+summarize@SM8650"]
    for e in evals:
        assert not any(acts[p].kind == "bundle" for p in plan.graph.predecessors(e))
    quantize = [a for a in acts.values() if a.kind == "llm_quantize"]
    assert all(sorted(r for r in a.inputs if r.startswith("adapter:")) == ["adapter:chat"] for a in quantize)
    rows = {r["path"]: r for r in plan.artifacts()}
    assert rows["SM8650/llm/llm_1_of_2_qnn.bin"]["verified_by"] == ["llm_part_eval/llm.part1@SM8650",
                                                                   "llm_quality/llm@SM8650"]  # perplexity, agreement
    assert rows["SM8650/llm/llm_2_of_2_qnn.bin"]["verified_by"] == ["llm_part_eval/llm.part2@SM8650",
                                                                   "llm_quality/llm@SM8650"]  # perplexity, agreement
