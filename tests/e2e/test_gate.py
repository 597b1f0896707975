"""The deploy gate end to end: a tiny recipe built with the installed toolchain, `ctxbuild check` against that
toolchain's QAIRT (loads) and QAIRT 2.47 (will not load, exit 1), the build-time gate for declared `runtimes:`,
and the verdict proven in a real onnxruntime 1.24.4 + onnxruntime-qnn 2.3.0 runtime: the wrapper opens there,
its binary does not load, and the EP's own compatibility API agrees with ctxbuild's rules."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ctxbuild.qnn.compat import Device, judge, parse
from tests._old_runtime import load, old_runtime_python
from tests.conftest import keep_only

RECIPE = """model: models/tiny_cnn.onnx
inputs:
  image: [1, 3, 64, 64]
precision: w8a16
calibration:
  dir: models/calib/tiny_cnn
targets: [SM8650]
"""
WRAPPER = "SM8650/tiny/tiny_ctx.onnx"


def _installed_qairt() -> str:
    import onnxruntime_qnn.build_and_package_info as info

    return info.qnn_version


@pytest.fixture
def built(tree: Path, ctxbuild, tmp_path: Path) -> Path:
    keep_only(tree)
    (tree / "tiny.yaml").write_text(RECIPE + f'runtimes:\n  - {{qairt: "{_installed_qairt()}"}}\n')
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    return out


def test_check_says_what_loads_where(built: Path, ctxbuild) -> None:
    qairt = _installed_qairt()
    r = ctxbuild("check", str(built), "--runtime", f"qairt={qairt}")
    assert r.code == 0, r.text
    assert f"{WRAPPER}  qairt={qairt}  SM8650  loads " in r.out and "1 checked: 1 load, 0 will not load" in r.out

    r = ctxbuild("check", str(built), "--runtime", "qairt=2.47", "--json")
    assert r.code == 1, r.text
    (row,) = json.loads(r.out)
    assert row["verdict"] == "will not load" and row["path"] == WRAPPER
    assert f"compiled by QAIRT {'.'.join(qairt.split('.')[:2])}, newer than the runtime's QAIRT 2.47" in row["reason"]
    assert row["ir_version"] <= 13 and row["ep_compatibility_info"].startswith("v2:6:")

    r = ctxbuild("check", str(built), "--runtime", f"qairt={qairt}", "--soc", "SM8750")  # v75 binary, v79 SoC
    assert r.code == 0 and "loads, not optimal" in r.out and "a build for v79 runs better" in r.out
    r = ctxbuild("check", str(built), "--runtime", f"qairt={qairt}", "--soc", "SM8550")  # v75 binary, v73 SoC
    assert r.code == 1 and "built for HTP v75, the SoC has v73" in r.out

    for args, says in [(["--runtime", "qairt=2.46"], "older than the oldest onnxruntime-qnn release"),
                       (["--runtime", "qairt=2.51", "--soc", "SM9999"], "--soc SM9999: unknown SoC"),
                       (["--runtime", "onnxruntime-qnn=1.0.0"], "not a published release")]:
        r = ctxbuild("check", str(built), *args)
        assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.text


def test_declared_runtimes_gate_the_build(built: Path, tree: Path, ctxbuild) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    (art,) = [a for a in manifest["artifacts"] if a["kind"] == "epcontext_model"]
    assert [v["verdict"] for v in art["runtimes"]] == ["loads"]
    assert art["compatibility"]["ep_compatibility_info"].startswith("v2:6:")

    (tree / "tiny.yaml").write_text(RECIPE + 'runtimes:\n  - {onnxruntime-qnn: "2.3.0"}\n')
    r = ctxbuild("build", str(tree), "-o", str(built))
    assert r.code == 1
    assert (f"FAILED deploy gate: {WRAPPER} will not load on onnxruntime-qnn=2.3.0 (qairt=2.47.0) (SM8650): "
            "compiled by QAIRT") in r.err
    report = json.loads((built / "report.json").read_text())
    assert report["build"]["outcome"] == "failed" and report["gate"][0]["verdict"] == "will not load"
    assert "Deploy gate" in (built / "report.html").read_text()
    r = ctxbuild("build", str(tree), "-o", str(built))  # a no-op build still fails the gate
    assert r.code == 1 and "FAILED deploy gate" in r.err

    (tree / "tiny.yaml").write_text(RECIPE + 'runtimes:\n  - {qairt: 2.50}\n')
    r = ctxbuild("build", str(tree), "-o", str(built))
    assert r.code == 2 and "tiny.yaml:9: runtimes.0.qairt: expected string" in r.err and '"2.50"' in r.err
    (tree / "tiny.yaml").write_text(RECIPE + 'runtimes:\n  - {qairt: "2.40"}\n')
    r = ctxbuild("build", str(tree), "-o", str(built))
    assert r.code == 2 and "tiny.yaml:9: runtimes[0]: QAIRT 2.40 is older than the oldest" in r.err


def test_the_old_runtime_proves_the_verdict(built: Path, tmp_path: Path) -> None:
    """onnxruntime 1.24.4 opens the wrapper (IR and opsets fine) and QNN 2.47 refuses its binary, as the gate said."""
    python = old_runtime_python()
    r = load(python, built / WRAPPER)
    assert not r["ok"] and "QNN_CONTEXT_ERROR_INVALID_ARGUMENT" in r["error"], r["error"]
    assert "IR version" not in r["error"]


# A tiny model compiled by onnxruntime-qnn 2.3.0 itself (a V1 info string), then the EP asked through
# onnxruntime's API with a session alive (without one it cannot answer) about variants of that string.
_ASK_EP = r"""
import json, sys, tempfile, numpy as np, onnx, onnxruntime as ort, onnxruntime_qnn
from onnx import helper, TensorProto
import onnxruntime.capi.onnxruntime_pybind11_state as C
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
d = tempfile.mkdtemp()
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), f"{d}/m.onnx")
so = ort.SessionOptions()
so.add_provider_for_devices(devices, {"backend_type": "htp", "htp_arch": "73", "soc_model": "60", "enable_htp_fp16_precision": "1"})
ort.ModelCompiler(so, f"{d}/m.onnx").compile_to_file(f"{d}/m_ctx.onnx")
info = {p.key: p.value for p in onnx.load(f"{d}/m_ctx.onnx").metadata_props}["ep_compatibility_info.QNNExecutionProvider"]
keep = ort.InferenceSession(f"{d}/m_ctx.onnx", so)
f = info.split(":")
variants = [info] + [":".join(f[:4] + [a] + f[5:]) for a in ("68", "79")] + [":".join(f[:2] + ["5.51.0"] + f[3:])]
print(json.dumps({v: str(C.get_model_compatibility_for_ep_devices(devices, v)).split(".")[-1] for v in variants}))
"""


def test_ep_compatibility_api_agrees_with_the_rules() -> None:
    python = old_runtime_python()
    r = subprocess.run([str(python), "-c", _ASK_EP], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    answers = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(answers) == 4
    runtime_own = parse(next(iter(answers)))  # what this runtime wrote itself describes the runtime
    assert runtime_own.format == 1 and runtime_own.sdk_version[:2] == (2, 47) and runtime_own.htp_archs == (73,)
    device = Device(sdk_version=runtime_own.sdk_version, backend_api_version=runtime_own.backend_api_version,
                    htp_arch=73, vtcm_mb=8)
    assert sorted(answers.values()) == ["EP_SUPPORTED_OPTIMAL", "EP_SUPPORTED_PREFER_RECOMPILATION",
                                        "EP_UNSUPPORTED", "EP_UNSUPPORTED"]
    for info, ep_says in answers.items():
        assert judge(parse(info), device)[0].value == ep_says, (info, ep_says)


def test_the_gate_reads_what_it_judges(built: Path, ctxbuild) -> None:
    """Every artifact is checked against the manifest's sha256, and bad OUTs, manifests and --runtime values are one
    line and exit 2, not a traceback."""
    qairt = f"qairt={_installed_qairt()}"
    binary = built / "SM8650" / "tiny" / "tiny_ctx_qnn.bin"
    data = binary.read_bytes()
    binary.unlink()  # a new file: the old one is a read-only hard link into the cache (docs/caching.md)
    binary.write_bytes(data + b"\0")  # appended: QNN might still read it, but it is not what was verified
    r = ctxbuild("check", str(built), "--runtime", qairt)
    assert r.code == 1 and "will not load" in r.out and "tiny_ctx_qnn.bin changed since the build" in r.out, r.text
    binary.unlink()
    r = ctxbuild("check", str(built), "--runtime", qairt)
    assert r.code == 1 and "SM8650/tiny/tiny_ctx_qnn.bin is missing" in r.out, r.text
    binary.write_bytes(data)
    assert ctxbuild("check", str(built), "--runtime", qairt).code == 0

    manifest = built / "manifest.json"
    saved = manifest.read_text()
    for bad, says in [("[]", "not a ctxbuild manifest"), ('{"artifacts": [{"path": 1}]}', "not a ctxbuild manifest"),
                      ("{", "no readable manifest.json")]:
        manifest.write_text(bad)
        r = ctxbuild("check", str(built), "--runtime", qairt)
        assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.text
    manifest.write_text(saved)
    for args, says in [([str(binary), "--runtime", qairt], "not an EPContext model or a build's output directory"),
                       ([str(built), "--runtime", "qairt=2.47,qairt=2.51"], "qairt given twice in one runtime")]:
        r = ctxbuild("check", *args)
        assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.text


def test_an_older_toolchains_binary_is_judged_by_its_header(tree: Path, ctxbuild, tmp_path: Path) -> None:
    """onnxruntime-qnn 2.3.0 writes HTP v68 into an SM8750 wrapper's compatibility info while compiling for v79:
    the gate reads the arch (and QAIRT) from the binary, as `inspect` does, and names the disagreement."""
    keep_only(tree)
    (tree / "tiny.yaml").write_text(RECIPE.replace("[SM8650]", "[SM8750]") + 'toolchain: {qairt: "2.47"}\n')
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    (wrapper,) = out.glob("SM8750/*/*_ctx.onnx")
    rel = str(wrapper.relative_to(out))
    r = ctxbuild("check", str(out), "--runtime", "qairt=2.51", "--json")
    assert r.code == 0, r.text
    (row,) = json.loads(r.out)
    assert row["path"] == rel and row["verdict"] == "loads" and "(HTP v79)" in row["reason"], row
    assert row["binary"]["targets"] == [[69, 79]] and row["binary"]["build_id"].startswith("v2.47.")
    if not row["ep_compatibility_info"].split(":")[4:5] == ["79"]:  # the EP's string disagrees: said, not used
        assert "the binary's header, used here: v79" in row["reason"], row["reason"]
    r = ctxbuild("check", str(out), "--runtime", "qairt=2.51", "--soc", "SM8650")  # a v79 binary on a v75 SoC
    assert r.code == 1 and "built for HTP v79, the SoC has v75" in r.out, r.text
    r = ctxbuild("check", str(out), "--runtime", "qairt=2.47")
    assert r.code == 0 and "loads" in r.out, r.text
