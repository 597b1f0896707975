"""adapters: {switch: alpha} (LoRA v3 hot switch) end to end with the real EP: four adapters resident in one binary
per SoC, both wrappers, the alpha map in manifest and inspect, verification per alpha row on the simulator, and the
float-I/O wrapper in plain onnxruntime with a float lora_alpha giving the verification's figures."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

from ctxbuild.lora import alpha as lora_alpha
from ctxbuild.verify.measure import metrics
from tests._qnn_models import cpu_run
from tests.conftest import ROOT

NAMES = ["formal", "casual", "pirate", "terse"]


def _recipe(d: Path, models: Path, extra: str = "", files: str | None = None, targets: str = "[SM8650, SM8750]") -> Path:
    text = (ROOT / "examples" / "lora_alpha.yaml").read_text().replace("../recipes/models/", f"{models}/")
    text = text.replace("targets: [SM8650, SM8750]", f"targets: {targets}")
    if files is not None:
        text = text.split("  files:\n")[0] + "  files:\n" + files + f"targets: {targets}\n"
    d.mkdir(parents=True, exist_ok=True)
    (d / "lora_alpha.yaml").write_text(text + extra)
    return d / "lora_alpha.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    from tests.conftest import run_cli

    tmp = tmp_path_factory.mktemp("alpha")
    recipe = _recipe(tmp / "recipes", example_models)
    r = run_cli(("build", str(recipe.parent), "-o", str(tmp / "out")), tmp / "cache", tmp)
    assert r.code == 0, r.text
    return tmp / "out"


# onnxruntime with the QNN EP as onnxruntime-qnn's docs set it up, in a process of its own (no ctxbuild; the CPU EP
# stays for the wrapper's Q/DQ): each row's alpha through the float-I/O wrapper, and as codes through the other
PLAIN = """
import json, sys
import numpy as np, onnxruntime as ort, onnxruntime_qnn
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
def session(path):
    so = ort.SessionOptions()
    so.add_provider_for_devices(devices, {"backend_type": "htp"})
    return ort.InferenceSession(path, so)
d, samples, rows, dst = sys.argv[1], np.load(sys.argv[2])["x"], json.loads(sys.argv[3]), sys.argv[4]
sess, qio = session(d + "/lora_alpha_ctx.onnx"), session(d + "/lora_alpha_ctx_qio.onnx")
enc = json.loads(qio.get_modelmeta().custom_metadata_map["ctxbuild.quantized_io"])
q = lambda v, e: np.clip(np.round(v / e["scale"]) + e["zero_point"], 0, 65535).astype(np.uint16)
out = {"base_default": sess.run(None, {"x": samples[0]})[0]}  # lora_alpha not fed: its default
for i, alpha in enumerate(rows):
    a = np.asarray(alpha, np.float32)
    out[f"float{i}"] = np.concatenate([sess.run(None, {"x": x, "lora_alpha": a})[0] for x in samples])
    codes = np.concatenate([qio.run(None, {"x": q(x, enc["x"]), "lora_alpha": q(a, enc["lora_alpha"])})[0] for x in samples])
    out[f"qio{i}"] = ((codes.astype(np.float64) - enc["y"]["zero_point"]) * enc["y"]["scale"]).astype(np.float32)
np.savez(dst, **out)
"""


def test_four_adapters_one_binary_per_soc_each_row_passes(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    for soc in ("SM8650", "SM8750"):
        d = built / soc / "lora_alpha"
        assert sorted(p.name for p in d.glob("*_qnn.bin")) == ["lora_alpha_ctx_qnn.bin"]  # one binary for all four
        result = json.loads((d / "lora_alpha_verify_alpha.json").read_text())
        rows = {r["row"]: r for r in result["rows"]}
        assert list(rows) == ["base", *NAMES, "formal+casual at 0.5"]
        for label, row in rows.items():
            assert row["verdict"] == "passed", (soc, label, row)
            assert row["outputs"]["y"]["cosine"] >= 0.999, (soc, label)  # at the recipe's precision, w8a16
            assert row["qio_max_abs_diff"] < 1e-3  # both wrappers, one binary: the same codes out
        for name in NAMES:  # each adapter changes the output well beyond the quantization noise
            assert rows[name]["base_vs_merged"]["y"]["cosine"] < 0.99
        assert result["indistinguishable"] == [] and result["samples"] == 4
    kinds = {(a["target"]["name"], a["kind"]) for a in manifest["artifacts"]}
    assert ("SM8650", "epcontext_model_quantized_io") in kinds and ("SM8750", "epcontext_model") in kinds
    for art in manifest["artifacts"]:
        if art["kind"].startswith("epcontext_model"):
            m = art["lora_alpha"]
            assert [(a["index"], a["name"], a["rank"], a["scale"]) for a in m["adapters"]] == [
                (0, "formal", 8, 1.0), (1, "casual", 8, 1.0), (2, "pirate", 8, 0.5), (3, "terse", 4, 2.0)]
            assert m["adapters"][3]["targets"] == ["layer1"] and m["adapters"][0]["targets"] == ["layer1", "layer2"]
            qio = art["kind"] == "epcontext_model_quantized_io"
            assert m["codes"] == ({"dtype": "uint16", "off": 0, "on": 65535, "scale": pytest.approx(1 / 65535),
                                   "zero_point": 0} if qio else {"dtype": "float32", "off": 0.0, "on": 1.0})
            assert art["verification"]["status"] == "passed"


def test_inspect_shows_the_alpha_map(built: Path, ctxbuild) -> None:
    r = ctxbuild("inspect", str(built / "SM8650" / "lora_alpha" / "lora_alpha_ctx_qio.onnx"))
    assert r.code == 0, r.text
    assert "LoRA alpha switch: input lora_alpha[4], uint16 codes: off 0, on 65535" in r.out
    assert "3      terse    4     2      layer1" in r.out
    r = ctxbuild("inspect", "--json", str(built / "SM8650" / "lora_alpha" / "lora_alpha_ctx.onnx"))
    assert json.loads(r.out)["lora_alpha"]["codes"]["dtype"] == "float32"


def test_float_io_wrapper_in_plain_onnxruntime_gives_the_verification_figures(built: Path, example_models: Path,
                                                                              tmp_path: Path) -> None:
    d = built / "SM8650" / "lora_alpha"
    result = json.loads((d / "lora_alpha_verify_alpha.json").read_text())
    inputs = onnx.load(str(d / "lora_alpha_ctx.onnx")).graph.input
    assert [(i.name, i.type.tensor_type.elem_type) for i in inputs] == [("x", TensorProto.FLOAT),
                                                                         ("lora_alpha", TensorProto.FLOAT)]
    samples = [np.load(p)["x"] for p in sorted((example_models / "calib" / "lora_mlp").glob("*.npz"))]
    np.savez(tmp_path / "x.npz", x=np.stack(samples))
    rows = [r["lora_alpha"] for r in result["rows"]]
    p = subprocess.run([sys.executable, "-c", PLAIN, str(d), str(tmp_path / "x.npz"), json.dumps(rows),
                        str(tmp_path / "got.npz")], capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    got = np.load(tmp_path / "got.npz")
    for i, row in enumerate(result["rows"]):
        ref = _merged_reference(example_models, row["lora_alpha"], tmp_path / row["row"].replace(" ", "_"), samples)
        m = metrics(ref, got[f"float{i}"])
        assert m["cosine"] == row["outputs"]["y"]["cosine"] and m["snr_db"] == row["outputs"]["y"]["snr_db"], row["row"]
        assert np.abs(got[f"qio{i}"] - got[f"float{i}"]).max() < 1e-3  # the same binary fed codes: the same outputs
    # lora_alpha is optional: its default, all zeros, is the base
    assert np.array_equal(got["base_default"], got["float0"][:1])


def _merged_reference(models: Path, alpha: list[float], d: Path, samples: list[np.ndarray]) -> np.ndarray:
    """The base with the adapters merged into its weights, written here from the files (not ctxbuild's merge)."""
    from safetensors.numpy import load_file

    pirate = ort.AdapterFormat.read_adapter(str(models / "adapters" / "pirate.onnx_adapter"))
    raw = [load_file(str(models / "adapters" / "formal.safetensors")),
           {k.replace("base_model.", "").replace(".weight", ""): v
            for k, v in np.load(models / "adapters" / "casual.npz").items()},
           {k: v.numpy().copy() for k, v in pirate.get_parameters().items()},  # copies: the format owns the memory
           {k.replace("base_model.model.", "").replace(".weight", ""): v
            for k, v in load_file(str(models / "adapters" / "terse.safetensors")).items()}]
    scales = [1.0, 1.0, 0.5, 2.0]
    model = onnx.load(str(models / "lora_base.onnx"))
    for t in model.graph.initializer:
        w = numpy_helper.to_array(t).copy()
        layer = t.name.removesuffix(".weight")
        for a, s, ad in zip(alpha, scales, raw):
            if a and f"{layer}.lora_A" in ad:
                A, B = ad[f"{layer}.lora_A"], ad[f"{layer}.lora_B"]
                w += a * s * (A.T @ B.T if A.shape[1] == w.shape[0] and A.shape[0] != w.shape[0] else A @ B)
        t.CopyFrom(numpy_helper.from_array(w.astype(np.float32), t.name))
    d.mkdir(parents=True)
    onnx.save(model, str(d / "merged.onnx"))
    return np.concatenate([cpu_run(d / "merged.onnx", {"x": x})[0] for x in samples])


def test_an_adapter_the_samples_cannot_tell_from_the_base_is_reported(tmp_path: Path, example_models: Path,
                                                                      ctxbuild) -> None:
    ghost = tmp_path / "ghost.safetensors"
    rng = np.random.default_rng(5)
    save_file({"base_model.model.layer2.lora_A.weight": (rng.standard_normal((4, 128)) * 1e-4).astype(np.float32),
               "base_model.model.layer2.lora_B.weight": (rng.standard_normal((64, 4)) * 1e-4).astype(np.float32)},
              str(ghost))
    files = (f"    - {{name: formal, file: {example_models}/adapters/formal.safetensors}}\n"
             f"    - {{name: ghost, file: {ghost}}}\n")
    recipe = _recipe(tmp_path / "r", example_models, files=files, targets="[SM8650]")
    r = ctxbuild("build", str(recipe.parent), "-o", str(tmp_path / "out"))
    assert r.code == 0, r.text
    assert "adapter 'ghost': on these samples its outputs cannot be told from the base's" in r.text
    result = json.loads((tmp_path / "out" / "SM8650" / "lora_alpha" / "lora_alpha_verify_alpha.json").read_text())
    assert result["indistinguishable"] == ["ghost"]
    assert {r["row"]: r["verdict"] for r in result["rows"]}["ghost"] == "indistinguishable"


@pytest.mark.parametrize("extra, message", [
    ("  slots: ['*lora_A']\n", "adapters.slots belongs to adapters bound as .onnx_adapter, not to switch: alpha"),
    ("multi_soc: true\n", "switch: alpha is built for single-graph recipes (multi_soc is not supported with it yet)"),
])
def test_recipe_errors_are_one_line_exit_2(tmp_path: Path, example_models: Path, ctxbuild, extra: str,
                                           message: str) -> None:
    recipe = _recipe(tmp_path / "r", example_models)
    text = recipe.read_text()
    text = text.replace("  switch: alpha", "  switch: alpha\n" + extra.rstrip("\n")) if extra.startswith("  ") \
        else text + extra
    recipe.write_text(text)
    r = ctxbuild("build", str(recipe.parent), "-o", str(tmp_path / "out"))
    assert r.code == 2, r.text
    assert message in r.err and r.err.count("\n") <= 2, r.err


def test_a_module_no_node_matches_fails_naming_it(tmp_path: Path, example_models: Path, ctxbuild) -> None:
    bad = tmp_path / "bad.safetensors"
    save_file({"base_model.model.layer9.lora_A.weight": np.zeros((4, 64), np.float32),
               "base_model.model.layer9.lora_B.weight": np.zeros((128, 4), np.float32)}, str(bad))
    recipe = _recipe(tmp_path / "r", example_models, files=f"    - {{name: bad, file: {bad}}}\n", targets="[SM8650]")
    r = ctxbuild("build", str(recipe.parent), "-o", str(tmp_path / "out"))
    assert r.code == 1
    assert "module 'layer9' matches no MatMul, Gemm or Conv node of the model" in r.text
    assert "targets: {layer9: <node name>}" in r.text


def _conv_gemm_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "conv.weight"),
             numpy_helper.from_array(rng.standard_normal((10, 8 * 6 * 6)).astype(np.float32) * 0.1, "fc.weight"),
             numpy_helper.from_array(np.asarray([1, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="conv", pads=[0, 0, 0, 0]),
             helper.make_node("Reshape", ["c", "shape"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc.weight"], ["y"], name="fc", transB=1, alpha=0.5)]
    g = helper.make_graph(nodes, "cg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_branches_on_conv_and_gemm_equal_the_merged_weights(tmp_path: Path) -> None:
    """The graph the binary is compiled from: lora_alpha one-hot (and a mix) gives the base with the adapters merged
    (float, CPU EP), for a Conv (PEFT's conv LoRA: A a conv with the base's kernel, B 1x1) and a Gemm (transB, alpha)."""
    rng = np.random.default_rng(1)
    files = {}
    for name, r in (("one", 2), ("two", 3)):
        files[name] = tmp_path / f"{name}.safetensors"
        save_file({"conv.lora_A.weight": rng.standard_normal((r, 3, 3, 3)).astype(np.float32) * 0.3,
                   "conv.lora_B.weight": rng.standard_normal((8, r, 1, 1)).astype(np.float32) * 0.3,
                   "fc.lora_A.weight": rng.standard_normal((r, 288)).astype(np.float32) * 0.1,
                   "fc.lora_B.weight": rng.standard_normal((10, r)).astype(np.float32) * 0.1}, str(files[name]))
    spec = {"input": "lora_alpha", "targets": {},
            "adapters": [{"name": "one", "tensors": {}, "scale": 1.0}, {"name": "two", "tensors": {}, "scale": 0.5}]}
    model = _conv_gemm_model()
    alpha_map = lora_alpha.attach(model, spec, files)
    assert [(a["rank"], [t["op"] for t in a["targets"]]) for a in alpha_map["adapters"]] == [
        (2, ["Conv", "Gemm"]), (3, ["Conv", "Gemm"])]
    onnx.save(model, str(tmp_path / "branched.onnx"))
    deltas = lora_alpha.deltas(alpha_map, spec, files)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    for alpha in ([0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.5]):
        got = cpu_run(tmp_path / "branched.onnx", {"x": x, "lora_alpha": np.asarray(alpha, np.float32)})[0]
        merged = _conv_gemm_model()
        for t in merged.graph.initializer:
            w = numpy_helper.to_array(t).astype(np.float32)
            for a, d in zip(alpha, deltas):
                w = w + a * d.get(t.name, 0)
            t.CopyFrom(numpy_helper.from_array(w.astype(w.dtype if t.name != "shape" else np.int64), t.name))
        onnx.save(merged, str(tmp_path / "merged.onnx"))
        ref = cpu_run(tmp_path / "merged.onnx", {"x": x})[0]
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-4), alpha
        if any(alpha):
            assert not np.allclose(got, cpu_run(tmp_path / "branched.onnx", {"x": x, "lora_alpha": np.zeros(2, np.float32)})[0])


def test_llm_recipe_switches_by_alpha_across_parts(tmp_path: Path, example_models: Path, ctxbuild) -> None:
    """examples/llm_alpha.yaml: both adapters of the llm example attached to the base decoder's q_proj/v_proj, 2
    parts; every part takes the same lora_alpha, each adapter is verified token by token with its one-hot bound."""
    d = tmp_path / "llm"
    d.mkdir()
    text = (ROOT / "examples" / "llm_alpha.yaml").read_text().replace("../recipes/models/", f"{example_models}/")
    (d / "llm_alpha.yaml").write_text(text)
    r = ctxbuild("build", str(d), "-o", str(tmp_path / "out"), timeout=1200)
    assert r.code == 0, r.text
    t = tmp_path / "out" / "SM8650" / "llm_alpha"
    for name in ("chat", "summarize"):
        result = json.loads((t / "adapters" / f"{name}_llm_verify.json").read_text())
        row = result["by_cl"]["64"]
        assert result["passed"] and row["simulator"]["token_agreement"] >= 0.75, result
        assert row["tokens_changed_by_adapter"] > 0.2  # the adapter is on: it changes the greedy tokens
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    wrappers = [a for a in manifest["artifacts"] if a["kind"] == "epcontext_model"]
    assert len(wrappers) == 4  # 2 parts x (prompt, token) graphs, all of them with a branch
    for art in wrappers:
        inputs = {i.name: i for i in onnx.load(str(tmp_path / "out" / art["path"])).graph.input}
        assert list(inputs["lora_alpha"].type.tensor_type.shape.dim)[0].dim_value == 2
        assert [(a["index"], a["name"], a["rank"]) for a in art["lora_alpha"]["adapters"]] == [(0, "chat", 4),
                                                                                              (1, "summarize", 4)]
    text = text.replace("precision: w8a16", "precision: fp16")
    (d / "llm_alpha.yaml").write_text(text)
    r = ctxbuild("build", str(d), "-o", str(tmp_path / "out2"))
    assert r.code == 2 and "llm.adapters with switch: alpha at precision fp16 is not built yet" in r.err, r.text


def test_section_configs_name_the_binarys_graphs_and_check_refuses_wrong_ones(built: Path, tmp_path: Path,
                                                                              ctxbuild) -> None:
    """LoRAv2 sections made elsewhere (opaque here: no section can be made without the QAIRT SDK), one plain and one
    grouped (encodings, then weights), for two bases: configs per section with the graph names libQnnSystem reads
    from each binary; `check` exits 2 on a graph name the binary lacks or another base's section."""
    from ctxbuild.qnn.contextbin import describe

    d = tmp_path / "vendor"
    d.mkdir()
    for soc in ("SM8650", "SM8750"):
        shutil.copy(built / soc / "lora_alpha" / "lora_alpha_ctx_qnn.bin", d / f"base_{soc}.bin")
    for name in ("fr", "de_enc", "de_w"):
        (d / f"{name}.bin").write_bytes(name.encode() * 64)
    for soc in ("SM8650", "SM8750"):
        (d / f"v_{soc}.yaml").write_text(
            f"prebuilt:\n  bin: base_{soc}.bin\n  adapters:\n    fr: fr.bin\n"
            f"    de: {{encodings: de_enc.bin, weights: de_w.bin}}\ntargets: [{soc}]\n")
    out = tmp_path / "out"
    r = ctxbuild("build", str(d), "-o", str(out))
    assert r.code == 0, r.text
    t = out / "SM8650" / "v_SM8650"
    graph = describe(d / "base_SM8650.bin")["binaries"][0]["graphs"][0]["name"]
    assert graph.startswith("QNNExecutionProvider_QNNExecutionProvider_")  # the binary's own name for its graph
    assert (t / "fr.lora_config").read_text() == f"{graph};adapters/fr.bin\n"
    assert (t / "de.encodings.lora_config").read_text() == f"{graph};adapters/de.encodings.bin\n"
    assert (t / "de.weights.lora_config").read_text() == f"{graph};adapters/de.weights.bin\n"
    manifest = json.loads((out / "manifest.json").read_text())
    de = next(a for a in manifest["adapters"] if a["name"] == "de" and a["target"]["name"] == "SM8650")
    assert de["apply_in_order"] == ["SM8650/v_SM8650/de.encodings.lora_config", "SM8650/v_SM8650/de.weights.lora_config"]
    assert de["binds"]["graphs"] == [graph]

    r = ctxbuild("check", str(out), "--runtime", "onnxruntime-qnn=2.7.0", "--no-ep")
    assert r.code == 0, r.text
    r = ctxbuild("check", str(t / "fr.lora_config"))
    assert r.code == 0 and "every line names a graph of the binary beside it" in r.out, r.text

    (t / "fr.lora_config").write_text("model_graph;adapters/fr.bin\n")  # a name that is not the binary's
    r = ctxbuild("check", str(out), "--runtime", "onnxruntime-qnn=2.7.0", "--no-ep")
    assert r.code == 2, r.text
    assert f"fr.lora_config:1: graph 'model_graph' is not in v_SM8650_qnn.bin (its graphs: {graph})" in r.err
    r = ctxbuild("check", str(t / "fr.lora_config"))
    assert r.code == 2 and "graph 'model_graph' is not in" in r.err and r.err.count("\n") <= 2, r.err

    other = "../../SM8750/v_SM8750/adapters/fr.bin"  # the section ctxbuild packaged for the other base
    (t / "fr.lora_config").write_text(f"{graph};{other}\n")
    r = ctxbuild("check", str(out), "--runtime", "onnxruntime-qnn=2.7.0", "--no-ep")
    assert r.code == 2 and f"section {other} was packaged for v_SM8750@SM8750's binary, not v_SM8650@SM8650's" in r.err


def test_every_published_toolchain_builds_and_passes_it(tmp_path: Path, example_models: Path) -> None:
    """onnxruntime-qnn 2.3.0 to 2.6.0 (QAIRT 2.47-2.50, provisioned as a user's build does) and the installed 2.7.0:
    each builds the 4-adapter recipe for one SoC and every alpha row passes on its own simulator."""
    from tests.conftest import build_with_toolchains

    versions = ["2.3.0", "2.4.0", "2.5.0", "2.6.0"]
    recipe = _recipe(tmp_path / "r", example_models, targets="[SM8750]",
                     extra="toolchain: [installed, " + ", ".join(f'"{v}"' for v in versions) + "]\n")
    build_with_toolchains(recipe.parent, tmp_path / "out", tmp_path / "cache")
    built = sorted(p.parent.name for p in (tmp_path / "out" / "SM8750").glob("*/*_verify_alpha.json"))
    assert built == ["lora_alpha", "lora_alpha-qairt-2.47.0", "lora_alpha-qairt-2.48.40", "lora_alpha-qairt-2.49.40",
                     "lora_alpha-qairt-2.50.40"]
    for name in built:
        result = json.loads((tmp_path / "out" / "SM8750" / name / f"{name}_verify_alpha.json").read_text())
        assert [r["verdict"] for r in result["rows"]] == ["passed"] * 6, name
        assert min(r["outputs"]["y"]["cosine"] for r in result["rows"]) >= 0.999, name
