"""LoRA adapters end to end with the real EP: compile once, bind each adapter at run time, rebuild only what
an adapter change needs, clear errors for bad adapter files, LoRAv2 sections for prebuilt binaries."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests._adapters import adapter_values, merged_model
from tests.conftest import last_build
from tests._qnn_models import cosine, cpu_run, qnn_session

ADAPTERS = ("formal", "casual", "pirate")


@pytest.fixture
def lora(tree: Path) -> Path:
    """The lora_mlp example alone, for one target (keeps the tests quick)."""
    d = tree.parent / "lora_recipes"
    d.mkdir()
    text = (tree / "lora_mlp.yaml").read_text().replace("models/", f"{tree}/models/")
    (d / "lora_mlp.yaml").write_text(text + "targets: [SM8650]\n")
    return d / "lora_mlp.yaml"


@pytest.fixture
def built(lora: Path, tmp_path: Path, ctxbuild) -> Path:
    out = tmp_path / "out"
    r = ctxbuild("build", str(lora.parent), "-o", str(out))
    assert r.code == 0, r.text
    return out


def test_app_binds_each_adapter_and_matches_the_merged_float_model(built: Path, tree: Path, tmp_path: Path) -> None:
    d = built / "SM8650" / "lora_mlp"
    sess = qnn_session(d / "lora_mlp_ctx.onnx")  # one compiled base for every adapter
    assert [i.name for i in sess.get_inputs()] == ["x"]  # the slots are optional: defaults in the wrapper
    x = np.load(tree / "models" / "calib" / "lora_mlp" / "sample_001.npz")["x"]
    base = tree / "models" / "lora_mlp.onnx"
    no_adapter = sess.run(None, {"x": x})[0]
    assert cosine(no_adapter, cpu_run(base, {"x": x})[0]) > 0.999
    outputs = {}
    for name in ADAPTERS:
        binding = d / "adapters" / f"{name}.onnx_adapter"
        lora = ort.LoraAdapter()
        lora.Load(str(binding))
        ro = ort.RunOptions()
        ro.add_active_adapter(lora)
        got = sess.run(None, {"x": x}, ro)[0]
        ref = cpu_run(merged_model(base, adapter_values(binding), tmp_path / f"{name}.onnx"), {"x": x})[0]
        assert cosine(got, ref) > 0.999, (name, cosine(got, ref))
        assert cosine(got, no_adapter) < 0.99  # the adapter really changed the output
        outputs[name] = got
    assert cosine(outputs["formal"], outputs["casual"]) < 0.99
    # the recipe's `scale: 0.5` for pirate is bound with it
    assert adapter_values(d / "adapters" / "pirate.onnx_adapter")["lora_scale"].tolist() == [0.5]

    manifest = json.loads((built / "manifest.json").read_text())
    rows = {a["name"]: a for a in manifest["adapters"]}
    assert set(rows) == set(ADAPTERS)
    for name, row in rows.items():
        assert row["kind"] == "onnx_adapter" and row["verification"]["status"] == "passed"
        assert row["binds"]["slots"][:4] == ["layer1.lora_A", "layer1.lora_B", "layer2.lora_A", "layer2.lora_B"]
        f = row["files"][0]
        assert (built / f["path"]).stat().st_size == f["size"]
    results = {n: json.loads((d / "adapters" / f"{n}_verify.json").read_text()) for n in ADAPTERS}
    assert {n: r["calibrated"] for n, r in results.items()} == {"formal": True, "casual": True, "pirate": False}
    report = json.loads((built / "report.json").read_text())
    (row,) = report["rows"]
    assert [v["graph"] for v in row["verify"]] == ["lora_mlp"] + [f"lora_mlp + adapter {n}" for n in ADAPTERS]


def test_adapter_outside_calibration_set_rebuilds_only_its_own_actions(built: Path, lora: Path, tree: Path,
                                                                       tmp_path: Path, ctxbuild) -> None:
    own = {"adapter/lora_mlp+pirate@SM8650", "verify_adapter/lora_mlp+pirate@SM8650"}
    # change pirate (not calibrated over): only its binding and its verification run, never the compile
    pirate = tree / "models" / "adapters" / "pirate.onnx_adapter"
    values = adapter_values(pirate)
    values["layer1.lora_B"] = values["layer1.lora_B"] * 0.5
    _write_adapter(pirate, values)
    r = ctxbuild("build", str(lora.parent), "-o", str(built), "--explain")
    assert r.code == 0, r.text
    assert set(last_build(built)) == own
    assert "explain: adapter/lora_mlp+pirate@SM8650: ran: not in cache; changed: inputs (adapter)" in r.text

    # touched, same bytes: the adapter's edge runs (ninja sees a new mtime), its output is unchanged, and
    # restat stops there: the verification does not run again
    time.sleep(0.01)
    pirate.touch()
    r = ctxbuild("build", str(lora.parent), "-o", str(built))
    assert r.code == 0, r.text
    assert set(last_build(built)) == {"adapter/lora_mlp+pirate@SM8650"}

    # through the cache: a fresh OUT restores the compile and rebuilds nothing else than the cache holds
    fresh = tmp_path / "fresh"
    r = ctxbuild("build", str(lora.parent), "-o", str(fresh))
    assert r.code == 0, r.text
    assert set(last_build(fresh).values()) == {"cache"}

    # a new adapter: its two actions only (the recipe changed, so the plan is redone)
    shutil.copy(tree / "models" / "adapters" / "formal.safetensors", tree / "models" / "adapters" / "extra.safetensors")
    time.sleep(0.01)
    lora.write_text(lora.read_text().replace(
        "    - {name: pirate,", f"    - {{name: extra, file: {tree}/models/adapters/extra.safetensors}}\n    - {{name: pirate,"))
    r = ctxbuild("build", str(lora.parent), "-o", str(built))
    assert r.code == 0, r.text
    assert set(last_build(built)) == {"adapter/lora_mlp+extra@SM8650", "verify_adapter/lora_mlp+extra@SM8650"}

    # changing the calibration set re-quantizes and recompiles
    time.sleep(0.01)
    lora.write_text(lora.read_text().replace("calibrate: [formal, casual]", "calibrate: [formal, casual, pirate]"))
    r = ctxbuild("build", str(lora.parent), "-o", str(built))
    assert r.code == 0, r.text
    ran = set(last_build(built))
    assert "compile/lora_mlp@SM8650" in ran and any(i.startswith("quantize/") for i in ran)


def _write_adapter(path: Path, values: dict[str, np.ndarray]) -> None:
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(1)
    fmt.set_model_version(1)
    arrays = {k: np.ascontiguousarray(v) for k, v in sorted(values.items())}
    fmt.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in arrays.items()})
    fmt.export_adapter(str(path))


def test_adapter_that_does_not_fit_the_encodings_fails_naming_the_clipping_tensors(
        built: Path, lora: Path, tree: Path, ctxbuild) -> None:
    pirate = tree / "models" / "adapters" / "pirate.onnx_adapter"
    _write_adapter(pirate, {k: v * 8 for k, v in adapter_values(pirate).items()})
    r = ctxbuild("build", str(lora.parent), "-o", str(built))
    assert r.code == 1
    assert "FAILED verify_adapter/lora_mlp+pirate@SM8650" in r.text
    assert "does not fit the base's encodings" in r.text and "layer1.lora_B" in r.text and "clip" in r.text
    assert set(last_build(built)) == {"adapter/lora_mlp+pirate@SM8650", "verify_adapter/lora_mlp+pirate@SM8650"}
    manifest = json.loads((built / "manifest.json").read_text())
    status = {a["name"]: a["verification"]["status"] for a in manifest["adapters"]}
    assert status == {"formal": "passed", "casual": "passed", "pirate": "failed"}


@pytest.mark.parametrize("case, code, message", [
    ("wrong_shape", 1, "tensor 'layer1.lora_A' has shape [8, 64], slot 'layer1.lora_A' needs [64, 8]"),
    ("wrong_name", 1, "tensor 'layer1.lora_AA' matches no adapter slot of the model (did you mean 'layer1.lora_A'?"),
    ("missing", 2, "lora_mlp.yaml:12: adapter 'formal': file"),
    ("bad_calibrate", 2, "lora_mlp.yaml:10: 'nobody' is not an adapter of this recipe"),
    ("bad_format", 2, "'x.bin' is not an adapter file"),
    ("multi_soc", 2, "adapters cannot be combined with multi_soc yet"),
    ("no_slot", 1, "adapters.slots: '*lora_C' matches no initializer or input of the model"),
])
def test_bad_adapter_files_fail_with_clear_errors(lora: Path, tree: Path, tmp_path: Path, ctxbuild,
                                                  case: str, code: int, message: str) -> None:
    adapters = tree / "models" / "adapters"
    text = lora.read_text()
    if case == "wrong_shape":
        np.savez(adapters / "bad.npz", **{"layer1.lora_A": np.zeros((8, 64), np.float32)})
    elif case == "wrong_name":
        np.savez(adapters / "bad.npz", **{"layer1.lora_AA": np.zeros((64, 8), np.float32)})
    if case in ("wrong_shape", "wrong_name"):  # pirate: outside the calibration set, read by its own action
        text = text.replace("pirate.onnx_adapter", "bad.npz")
    elif case == "missing":
        text = text.replace("formal.safetensors", "gone.safetensors")
    elif case == "bad_calibrate":
        text = text.replace("calibrate: [formal, casual]", "calibrate: [formal, nobody]")
    elif case == "bad_format":
        text = text.replace(f"{tree}/models/adapters/formal.safetensors", "x.bin")
    elif case == "multi_soc":
        text = text.replace("targets: [SM8650]", "targets: [SM8650, SM8750]\nmulti_soc: true")
    elif case == "no_slot":
        text = text.replace('"*lora_B"]', '"*lora_B", "*lora_C"]')
    lora.write_text(text)
    r = ctxbuild("build", str(lora.parent), "-o", str(tmp_path / "out"))
    assert r.code == code, r.text
    assert message in r.text, r.text
    if case in ("wrong_shape", "wrong_name"):  # the adapter's own actions fail; the base still compiled
        assert "bad.npz" in r.text and "FAILED adapter/lora_mlp+pirate@SM8650" in r.text
        assert (tmp_path / "out" / "SM8650" / "lora_mlp" / "lora_mlp_ctx.onnx").is_file()


def test_prebuilt_with_lora_v2_sections(built: Path, tmp_path: Path, ctxbuild) -> None:
    """A binary ctxbuild compiled stands in for the base; the sections' content is opaque to ctxbuild (no
    section can be made here: see docs/limitations.md). A copy of the base whose SDK build id string is rewritten stands
    in for a base made with another QAIRT SDK."""
    from ctxbuild.qnn.contextbin import describe

    d = tmp_path / "vendor"
    d.mkdir()
    base = d / "base.bin"
    shutil.copy(built / "SM8650" / "lora_mlp" / "lora_mlp_ctx_qnn.bin", base)
    (d / "fr.bin").write_bytes(b"\x01section-fr" * 64)
    (d / "de.bin").write_bytes(b"\x02section-de" * 64)
    recipe = d / "vendor_lora.yaml"
    recipe.write_text("prebuilt:\n  bin: base.bin\n  adapters:\n    fr: fr.bin\n    de: de.bin\ntargets: [SM8650]\n")
    out = tmp_path / "out2"
    r = ctxbuild("build", str(d), "-o", str(out))
    assert r.code == 0, r.text
    t = out / "SM8650" / "vendor_lora"
    graph = describe(base)["binaries"][0]["graphs"][0]["name"]
    for name in ("fr", "de"):
        assert (t / "adapters" / f"{name}.bin").read_bytes() == (d / f"{name}.bin").read_bytes()
        assert (t / f"{name}.lora_config").read_text() == f"{graph};adapters/{name}.bin\n"
        assert (t / "adapters" / f"{name}.bin").is_file()  # resolves from the wrapper's directory
    assert (t / "vendor_lora_ctx.onnx").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    sections = {a["name"]: a for a in manifest["adapters"]}
    assert set(sections) == {"fr", "de"}
    assert sections["fr"]["kind"] == "lora_v2_section" and sections["fr"]["binds"]["graphs"] == [graph]
    assert [f["path"] for f in sections["fr"]["files"]] == ["SM8650/vendor_lora/adapters/fr.bin",
                                                            "SM8650/vendor_lora/fr.lora_config"]

    # a base from another SDK: fails naming both versions; `sdk_mismatch: warn` lets it through
    data = base.read_bytes()
    ep = manifest["toolchain"]["qnn_sdk_build_id"]
    other = "v2.49.0." + "1" * (len(ep) - len("v2.49.0."))
    base.write_bytes(data.replace(ep.encode(), other.encode()))
    r = ctxbuild("build", str(d), "-o", str(out))
    assert r.code == 1
    assert f"built with QNN SDK {other}" in r.text and f"runs QNN {ep}" in r.text
    recipe.write_text(recipe.read_text().replace("  adapters:", "  sdk_mismatch: warn\n  adapters:"))
    r = ctxbuild("build", str(d), "-o", str(out))
    assert r.code == 0, r.text
    assert f"built with QNN SDK {other}" in r.text

    (d / "de.bin").write_bytes(b"")
    r = ctxbuild("build", str(d), "-o", str(out))  # planned before: the action finds it
    assert r.code == 1 and "LoRAv2 section 'de' is empty" in r.text, r.text
    r = ctxbuild("build", str(d), "-o", str(tmp_path / "out3"))  # a fresh plan: the recipe check
    assert r.code == 2 and "vendor_lora.yaml:6: LoRAv2 section 'de': 'de.bin' is empty" in r.text, r.text


def test_bundle_binds_shared_slots_to_each_graph(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """prefill and decode share weights and LoRA slots: each graph gets its own binding of every adapter."""
    import importlib.util

    from tests.conftest import RECIPES

    spec = importlib.util.spec_from_file_location("make_models", RECIPES / "models" / "make_models.py")
    make_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_models)  # the example's generator, at another token count
    models = tree / "models"
    onnx.save(make_models.lora_mlp(np.random.default_rng(12), tokens=1), models / "lora_mlp_t1.onnx")
    (models / "calib" / "lora_mlp_t1").mkdir()
    for i in range(2):
        x = np.random.default_rng(i).standard_normal((1, 1, 64)).astype(np.float32)
        np.savez(models / "calib" / "lora_mlp_t1" / f"s{i}.npz", x=x)
    d = tmp_path / "bundle_recipes"
    d.mkdir()
    (d / "lora_lm.yaml").write_text(f"""
bundle:
  - {{name: prefill, model: {models}/lora_mlp.onnx, calibration: {{dir: {models}/calib/lora_mlp}}}}
  - {{name: decode, model: {models}/lora_mlp_t1.onnx, calibration: {{dir: {models}/calib/lora_mlp_t1}}}}
precision: w8a16
targets: [SM8650]
adapters:
  slots: ["*lora_A", "*lora_B"]
  calibrate: [formal]
  files:
    - {{name: formal, file: {models}/adapters/formal.safetensors}}
""")
    out = tmp_path / "out"
    r = ctxbuild("build", str(d), "-o", str(out))
    assert r.code == 0, r.text
    t = out / "SM8650" / "lora_lm"
    manifest = json.loads((out / "manifest.json").read_text())
    rows = {(a["binds"]["graph"], a["name"]): a for a in manifest["adapters"]}
    assert set(rows) == {("prefill", "formal"), ("decode", "formal")}
    assert all(a["verification"]["status"] == "passed" for a in rows.values())
    for g in ("prefill", "decode"):
        binding = t / "adapters" / f"{g}.formal.onnx_adapter"
        assert sorted(adapter_values(binding)) == ["layer1.lora_A", "layer1.lora_B", "layer2.lora_A", "layer2.lora_B"]
        wrapper = onnx.load(t / f"{g}_ctx.onnx", load_external_data=False)
        assert {i.name for i in wrapper.graph.initializer} >= set(adapter_values(binding))  # optional inputs


def test_inspect_lists_updateable_tensors_when_a_binary_has_them(built: Path) -> None:
    """No binary with updateable tensors can be made here (QNN error 6022, see docs/limitations.md): the listing is shown
    on a real binary's description with one of its tensors moved to where libQnnSystem reports them."""
    from ctxbuild.qnn.contextbin import describe, format_text

    info = describe(built / "SM8650" / "lora_mlp" / "lora_mlp_ctx_qnn.bin")
    assert "updateable tensor" not in format_text(info)  # compiled binaries have none
    graph = info["binaries"][0]["graphs"][0]
    graph["updateable_tensors"] = [graph["inputs"].pop(1)]
    text = format_text(info)
    assert "1 updateable tensor(s) (upd): LoRAv2 adapter sections apply here" in text
    assert any(line.split()[:2] == ["upd", "layer1.lora_A"] for line in text.splitlines())
