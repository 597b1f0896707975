"""Multi-SoC binaries are byte-reproducible: QNN's embedded build time is normalized (ctxbuild/reproducible.py),
and the normalized container reads and loads exactly like the one QNN wrote."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxbuild.qnn.contextbin import describe
from ctxbuild.errors import ActionError
from ctxbuild.qnn.reproducible import build_time, normalize_multi_soc
from ctxbuild.layout import spec_name
from tests._qnn_models import qnn_session
from tests.conftest import keep_only, last_build

pytestmark = pytest.mark.e2e
FLEX = Path("SC8380XP+SM8750") / "tiny_cnn_flex"
ACTION = "compile/tiny_cnn_flex@SC8380XP+SM8750"
STAMP = re.compile(rb'"timestamp": "([^"]*)"')


@pytest.fixture
def flex_tree(tree: Path) -> Path:
    keep_only(tree, "tiny_cnn_flex.yaml")
    return tree


def _build(ctxbuild, tree: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> dict[str, bytes]:
    r = ctxbuild("build", str(tree), "-o", str(out), "--no-verify", *extra, env=env)
    assert r.code == 0, r.text
    return {p.name: p.read_bytes() for p in (out / FLEX).iterdir()}


def test_two_cold_builds_and_a_restore_are_byte_identical(flex_tree: Path, tmp_path: Path, ctxbuild) -> None:
    first = _build(ctxbuild, flex_tree, tmp_path / "a", "--no-cache")
    time.sleep(1.1)  # the wall clock QNN stamps has moved on by at least a second
    second = _build(ctxbuild, flex_tree, tmp_path / "b")  # cold too (empty cache), and stores into it
    assert last_build(tmp_path / "b")[ACTION] == "run"
    assert first == second
    stamps = set(STAMP.findall(first["tiny_cnn_flex_ctx_qnn.bin"]))
    assert stamps == {b"1970-01-01 00:00:00 UTC"}, stamps
    restored = _build(ctxbuild, flex_tree, tmp_path / "c")
    assert last_build(tmp_path / "c")[ACTION] == "cache"
    assert restored == first


def test_source_date_epoch_is_honoured_and_keyed(flex_tree: Path, tmp_path: Path, ctxbuild) -> None:
    _build(ctxbuild, flex_tree, tmp_path / "a")
    got = _build(ctxbuild, flex_tree, tmp_path / "b", env={"SOURCE_DATE_EPOCH": "1700000000"})
    assert last_build(tmp_path / "b")[ACTION] == "run"  # not the epoch-0 entry
    assert set(STAMP.findall(got["tiny_cnn_flex_ctx_qnn.bin"])) == {b"2023-11-14 22:13:20 UTC"}
    r = ctxbuild("build", str(flex_tree), "-o", str(tmp_path / "c"), "--no-verify",
                 env={"SOURCE_DATE_EPOCH": "yesterday"})
    assert r.code == 1 and "SOURCE_DATE_EPOCH='yesterday' is not a Unix time" in r.text, r.text


def test_build_time_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert build_time() == "1970-01-01 00:00:00 UTC"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert build_time() == "2023-11-14 22:13:20 UTC"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "-5")
    with pytest.raises(ActionError):
        build_time()
    with pytest.raises(ValueError, match="not a multi-SoC container"):
        normalize_multi_soc(b"not a zip", "1970-01-01 00:00:00 UTC")


def _session_error(wrapper: Path, soc_model: str) -> str:
    """How the EP answers a session on this wrapper: x86 HTP refuses multi-SoC contexts for running, so
    its message is what can be compared."""
    try:
        qnn_session(wrapper, soc_model=soc_model)
    except Exception as e:  # noqa: BLE001 - ORT's errors are untyped
        return str(e)
    return "loaded"


def test_normalized_container_reads_and_loads_like_the_original(flex_tree: Path, tmp_path: Path, ctxbuild) -> None:
    out = tmp_path / "out"
    built = _build(ctxbuild, flex_tree, out, "--no-cache")
    # The same compile without ctxbuild's normalization: what QNN itself wrote. In a fresh process, as
    # ctxbuild compiles: an earlier compile in the same process changes QNN's output bytes.
    spec = json.loads((out / ".ctxbuild" / "actions" / spec_name(ACTION)).read_text())
    record = json.loads((out / ".ctxbuild" / "records" / spec_name(ACTION)).read_text())
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    # Staged as the compile action stages it (the EP puts the model's path into the binary).
    subprocess.run([sys.executable, "-c", "import sys, json; from pathlib import Path; from ctxbuild.toolchain import installed as toolchain; "
                    "from ctxbuild.qnn.staging import fixed_dir, link_model, stage_name; from ctxbuild.qnn.lower import lower_file\n"
                    "with fixed_dir(stage_name(json.loads(sys.argv[4]))) as d:\n"
                    "    toolchain.compile_model(link_model(Path(sys.argv[1]), d, 'model.onnx'), Path(sys.argv[2]), "
                    "json.loads(sys.argv[3]), embed=False, cpu_fallback=False)\n"
                    "lower_file(Path(sys.argv[2]))", spec["inputs"]["model"],
                    str(raw_dir / "tiny_cnn_flex_ctx.onnx"), json.dumps(spec["params"]["provider_options"]),
                    json.dumps(record["key_detail"])], check=True, capture_output=True)
    raw = (raw_dir / "tiny_cnn_flex_ctx_qnn.bin").read_bytes()
    assert (raw_dir / "tiny_cnn_flex_ctx.onnx").read_bytes() == built["tiny_cnn_flex_ctx.onnx"]
    assert STAMP.findall(raw) and b"1970-01-01 00:00:00 UTC" not in STAMP.findall(raw)
    normalized, count = normalize_multi_soc(raw, "1970-01-01 00:00:00 UTC")
    assert count == 6 and normalized == built["tiny_cnn_flex_ctx_qnn.bin"] and len(normalized) == len(raw)
    assert sum(a != b for a, b in zip(raw, normalized)) <= count * len("0000-00-00 00:00:00")

    # libQnnSystem reads both identically (format, per-SoC entries, graphs, tensors, build id).
    def info(p: Path) -> dict:
        d = describe(p)
        for b in d["binaries"]:
            b.pop("source")
        return {k: v for k, v in d.items() if k != "path"}

    assert info(raw_dir / "tiny_cnn_flex_ctx_qnn.bin") == info(out / FLEX / "tiny_cnn_flex_ctx_qnn.bin")
    assert info(out / FLEX / "tiny_cnn_flex_ctx_qnn.bin")["binaries"][0]["format"] == "multi_soc"

    # The EP: the same answer for both, for each SoC of the container. The check can tell containers apart:
    # one whose metadata is broken gets another answer.
    broken_dir = tmp_path / "broken"
    broken_dir.mkdir()
    (broken_dir / "tiny_cnn_flex_ctx.onnx").write_bytes(built["tiny_cnn_flex_ctx.onnx"])
    broken = bytearray(normalized)
    at = broken.rfind(b"{", 0, broken.find(b'"timestamp"'))
    broken[at:at + 1] = b"["
    (broken_dir / "tiny_cnn_flex_ctx_qnn.bin").write_bytes(broken)
    for soc in ("60", "69"):
        original = _session_error(raw_dir / "tiny_cnn_flex_ctx.onnx", soc)
        assert original == _session_error(out / FLEX / "tiny_cnn_flex_ctx.onnx", soc)
        assert original != _session_error(broken_dir / "tiny_cnn_flex_ctx.onnx", soc)
