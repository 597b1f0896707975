"""Multi-SoC binaries, LoRA adapters and quantized I/O built by older published toolchains (provisioned on demand,
as CI's gate-matrix test does), each verified on that release's own simulator and passed by the gate for it:
- `multi_soc` with onnxruntime-qnn 2.5.0, the oldest release that writes a multi-SoC container (2.3.0 and 2.4.0
  ignore the SoC list: refused, tests/toolchains/test_toolchains.py). 2.5.0 names its per-SoC members `backend.metadataN`,
  not `htp.cache.<soc>.N` as 2.6.0 on: `inspect` reads them from the container's index;
- LoRA adapters and `compile.quantized_io` with 2.3.0, the oldest release: every adapter's file bound on the
  simulator, the quantized wrapper run as shipped;
- `input_values:` with 2.3.0 (its onnxruntime prepares and verifies): a LoRA bundle whose graphs fix an input to
  different values (tests/e2e/test_input_values.py's, built by the installed toolchain in the core suite)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from tests.conftest import build_with_toolchains, RECIPES, keep_only
from tests.e2e.test_input_values import lora_branchy_tree

pytestmark = pytest.mark.slow

QIO = ("targets: [phones, laptops]", "targets: [SM8650]\ncompile:\n  quantized_io: true")  # on the tiny_cnn example


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    root = tmp_path_factory.mktemp("old_features")
    tree = root / "recipes"
    shutil.copytree(example_models, tree / "models")
    keep_only(tree)
    (tree / "tiny_cnn_flex.yaml").write_text((RECIPES / "tiny_cnn_flex.yaml").read_text() + 'toolchain: "2.5.0"\n')
    (tree / "lora_mlp.yaml").write_text((RECIPES / "lora_mlp.yaml").read_text().replace(
        "precision: w8a16\n", "precision: w8a16\ntargets: [SM8650]\n") + 'toolchain: "2.3.0"\n')
    (tree / "tiny_cnn_qio.yaml").write_text((RECIPES / "tiny_cnn.yaml").read_text().replace(*QIO) + 'toolchain: "2.3.0"\n')
    lora_branchy_tree(tree / "values", 'toolchain: "2.3.0"\n')
    build_with_toolchains(tree, root / "out", root / "cache")
    return root / "out"


def _verified(out: Path, path: str) -> dict:
    result = json.loads((out / path).read_text())
    assert result["passed"], result
    return result


def test_multi_soc_by_2_5_holds_both_socs_and_passes(out: Path, ctxbuild) -> None:
    binary = out / "SC8380XP+SM8750" / "tiny_cnn_flex" / "tiny_cnn_flex_ctx_qnn.bin"
    r = ctxbuild("inspect", "--json", str(binary))
    assert r.code == 0, r.text
    (b,) = json.loads(r.out)["binaries"]
    assert b["format"] == "multi_soc" and b["build_id"].startswith("v2.49.40."), b["build_id"]
    assert [(t["soc_name"], t["htp_arch"]) for t in b["targets"]] == [("SC8380XP", 73), ("SM8750", 79)]
    # the x86 simulator loads no release's multi-SoC container: the single-SoC twin ran on 2.5.0's
    assert _verified(out, "SC8380XP+SM8750/tiny_cnn_flex/tiny_cnn_flex_verify.json")["method"] == \
        "single-SoC build (SC8380XP)"
    r = ctxbuild("check", str(binary.parent / "tiny_cnn_flex_ctx.onnx"), "--runtime", "onnxruntime-qnn=2.5.0")
    assert r.code == 0 and "2 load, 0 will not load" in r.out, r.text


def test_lora_and_quantized_io_by_2_3_run_on_its_simulator(out: Path, ctxbuild) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    by_path = {a["path"]: a for a in manifest["artifacts"]}
    assert by_path["SM8650/lora_mlp/lora_mlp_ctx_qnn.bin"]["toolchain"] == "onnxruntime-qnn-2.3.0"
    assert _verified(out, "SM8650/lora_mlp/lora_mlp_verify.json")["method"] == "direct"
    for adapter in ("formal", "casual", "pirate"):  # each adapter's shipped file bound on 2.3.0's simulator
        assert (out / "SM8650" / "lora_mlp" / "adapters" / f"{adapter}.onnx_adapter").is_file()
        assert _verified(out, f"SM8650/lora_mlp/adapters/{adapter}_verify.json")
    wrapper = onnx.load(out / "SM8650" / "tiny_cnn_qio" / "tiny_cnn_qio_ctx.onnx", load_external_data=False)
    assert wrapper.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT16  # as shipped, run as shipped
    assert _verified(out, "SM8650/tiny_cnn_qio/tiny_cnn_qio_verify.json")["method"] == "direct"
    for wrapper in ("lora_mlp/lora_mlp_ctx.onnx", "tiny_cnn_qio/tiny_cnn_qio_ctx.onnx"):
        r = ctxbuild("check", str(out / "SM8650" / wrapper), "--runtime", "qairt=2.47")
        assert r.code == 0 and "1 load, 0 will not load" in r.out, (wrapper, r.text)


def test_input_values_in_a_lora_bundle_by_2_3(out: Path) -> None:
    by_path = {a["path"]: a for a in json.loads((out / "manifest.json").read_text())["artifacts"]}
    assert by_path["SM8650/lm/lm_qnn.bin"]["toolchain"] == "onnxruntime-qnn-2.3.0"
    for graph in ("lora_on", "lora_off"):  # against the user's model run with mode 1 and 0 on 2.3.0's onnxruntime
        assert _verified(out, f"SM8650/lm/{graph}_verify.json")["outputs"]["out"]["snr_db"] > 30
        assert _verified(out, f"SM8650/lm/adapters/{graph}.formal_verify.json")
