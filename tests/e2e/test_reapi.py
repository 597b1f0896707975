"""The remote cache speaks Bazel's HTTP cache protocol: /ac/<key> holds a REAPI ActionResult, decoded here
with the official remote_execution.proto (Debian's bazel-bootstrap-source ships it with the googleapis
protos it imports; grpcio-tools' protoc compiles it), and every digest it names is a /cas/ blob."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ctxbuild.cache import Cache, LocalStore, RemoteStore
from ctxbuild.cache.reapi import METADATA_PATH, messages
from ctxbuild.layout import spec_name
from tests.conftest import keep_only, last_build, records

if TYPE_CHECKING:
    from tests.nginx_fixture import NginxCache, NginxServer

THIRD_PARTY = Path(os.environ.get("CTXBUILD_REAPI_PROTOS", "/usr/src/bazel-bootstrap/third_party"))
PROTO = "build/bazel/remote/execution/v2/remote_execution.proto"


@pytest.fixture(scope="session")
def official(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Message classes compiled from the official remote_execution.proto."""
    grpc_tools = pytest.importorskip("grpc_tools", reason="grpcio-tools (pip install -e '.[test]') compiles the proto")
    if not (THIRD_PARTY / "remoteapis" / PROTO).is_file():
        pytest.skip(f"official REAPI protos not found under {THIRD_PARTY} (Debian package: bazel-bootstrap-source)")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    out = tmp_path_factory.mktemp("reapi") / "reapi.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{THIRD_PARTY / 'remoteapis'}",
                    f"-I{THIRD_PARTY / 'googleapis'}", f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
                    f"--descriptor_set_out={out}", "--include_imports", PROTO], check=True)
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:  # --include_imports lists dependencies first
        pool.Add(f)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"build.bazel.remote.execution.v2.{n}"))
            for n in ("ActionResult", "Digest")}


def check_entry(data: bytes, cas: Path, official: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Decode an /ac/ entry with the official messages; every digest must name a /cas/ blob of that content."""
    result = official["ActionResult"].FromString(data)
    assert result.exit_code == 0 and not result.ListFields() == []
    digests = [f.digest for f in result.output_files]
    if result.HasField("stdout_digest"):  # optional: the verify memo's entries have no log
        digests.append(result.stdout_digest)
    for d in digests:
        blob = (cas / d.hash).read_bytes()
        assert len(blob) == d.size_bytes and hashlib.sha256(blob).hexdigest() == d.hash
    meta = next(f for f in result.output_files if f.path == METADATA_PATH)
    return result, json.loads((cas / meta.digest.hash).read_bytes())


def test_ac_entry_is_an_official_action_result(tmp_path: Path, nginx_cache: NginxCache, official) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "m_ctx.onnx").write_bytes(b"wrapper")
    (src / "m_ctx_qnn.bin").write_bytes(os.urandom(100_000))
    key = hashlib.sha256(b"reapi").hexdigest()
    cache = Cache(LocalStore(tmp_path / "first"), RemoteStore(nginx_cache.url, timeout=5))
    record = cache.store(key, {"ctx": src / "m_ctx.onnx", "bin": src / "m_ctx_qnn.bin"}, b"the log", {"id": "x"})
    assert record is not None and cache.warnings == []
    result, meta = check_entry((nginx_cache.root / "ac" / key).read_bytes(), nginx_cache.root / "cas", official)
    files = {f.path: (f.digest.hash, f.digest.size_bytes) for f in result.output_files}
    assert files == {"bin": (record.outputs[0].digest, 100_000), "ctx": (hashlib.sha256(b"wrapper").hexdigest(), 7),
                     METADATA_PATH: files[METADATA_PATH]}
    assert (result.stdout_digest.hash, result.stdout_digest.size_bytes) == (hashlib.sha256(b"the log").hexdigest(), 7)
    assert meta == {"version": 2, "key": key, "meta": {"id": "x"}}
    # What another REAPI client writes (the official classes) reads back as the same record.
    assert RemoteStore(nginx_cache.url).get_record(key) == record
    (nginx_cache.root / "ac" / key).write_bytes(result.SerializeToString())
    assert Cache(remote=RemoteStore(nginx_cache.url)).lookup(key) == record


def test_old_or_foreign_entries_are_plain_misses(tmp_path: Path, nginx_cache: NginxCache, official) -> None:
    ac = nginx_cache.root / "ac"
    ac.mkdir(parents=True, exist_ok=True)
    old = hashlib.sha256(b"old").hexdigest()
    (ac / old).write_bytes(json.dumps({"version": 1, "key": old, "outputs": [], "log_digest": None,
                                       "meta": {}}).encode())  # a ctxbuild 0.1 record
    foreign = hashlib.sha256(b"foreign").hexdigest()  # a Bazel action's result: no ctxbuild metadata
    blob = hashlib.sha256(b"x").hexdigest()
    (ac / foreign).write_bytes(official["ActionResult"](output_files=[{"path": "bazel-out/x", "digest": {
        "hash": blob, "size_bytes": 1}}]).SerializeToString())
    cache = Cache(LocalStore(tmp_path / "local"), RemoteStore(nginx_cache.url, timeout=5))
    assert cache.lookup(old) is None and cache.lookup(foreign) is None
    assert cache.warnings == [] and cache.misses == 2


def test_malformed_entry_is_rejected_with_a_warning(tmp_path: Path, nginx_cache: NginxCache) -> None:
    m = messages()
    bad = hashlib.sha256(b"bad").hexdigest()
    (nginx_cache.root / "ac").mkdir(parents=True, exist_ok=True)
    (nginx_cache.root / "ac" / bad).write_bytes(m["ActionResult"](output_files=[
        m["OutputFile"](path="ctx", digest=m["Digest"](hash="../../etc/passwd", size_bytes=1)),
        m["OutputFile"](path=METADATA_PATH, digest=m["Digest"](hash=bad, size_bytes=1))]).SerializeToString())
    cache = Cache(LocalStore(tmp_path / "local"), RemoteStore(nginx_cache.url, timeout=5))
    assert cache.lookup(bad) is None and "malformed" in cache.warnings[0]


@pytest.mark.e2e
def test_two_machines_share_builds_through_spec_entries(tree: Path, tmp_path: Path, ctxbuild,
                                                        nginx_server: NginxServer, official) -> None:
    keep_only(tree, "tiny_cnn.yaml")
    a, b = tmp_path / "out-a", tmp_path / "out-b"
    r = ctxbuild("build", str(tree), "-o", str(a), "--target", "SM8650", "--remote-cache", nginx_server.url,
                 env={"CTXBUILD_CACHE_DIR": str(tmp_path / "cache-a")})
    assert r.code == 0, r.text
    data = nginx_server.tmpdir / "data"
    keys = {rec["key"] for rec in records(a).values()}
    memo = {k for rec in records(a).values() for k in rec.get("memo_keys", {}).values()}  # verify's memo
    assert {p.name for p in (data / "ac").iterdir()} == keys | memo
    for k in keys | memo:
        _, meta = check_entry((data / "ac" / k).read_bytes(), data / "cas", official)
        assert meta["key"] == k
    r = ctxbuild("build", str(tree), "-o", str(b), "--target", "SM8650", "--remote-cache", nginx_server.url,
                 env={"CTXBUILD_CACHE_DIR": str(tmp_path / "cache-b")})
    assert r.code == 0, r.text
    assert set(last_build(b).values()) == {"cache"}
    assert {rec["cache_origin"] for rec in records(b).values()} == {"remote"}
    for rel in ("SM8650/tiny_cnn/tiny_cnn_ctx.onnx", "SM8650/tiny_cnn/tiny_cnn_ctx_qnn.bin"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes()


@pytest.mark.e2e
def test_misconfigured_remote_inside_an_action_is_a_warning(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """The driver refuses a bad URL up front (exit 2); an action reached without it (plain `ninja`, the
    `action` command) warns and builds."""
    keep_only(tree, "tiny_cnn.yaml")
    out = tmp_path / "out"
    assert ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650", "--no-verify").code == 0
    action = "compile/tiny_cnn@SM8650"
    (out / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx.onnx").unlink()
    for url in ("ftp://cache.example/", "http://127.0.0.1:notaport/"):
        r = ctxbuild("action", str(out / ".ctxbuild" / "actions" / spec_name(action)),
                     env={"CTXBUILD_REMOTE_CACHE": url})
        assert r.code == 0, r.text
        assert "warning: remote cache not used:" in r.err, r.err
        assert (out / "SM8650" / "tiny_cnn" / "tiny_cnn_ctx.onnx").is_file()
    assert ctxbuild("build", str(tree), "-o", str(out), "--remote-cache", "ftp://x/").code == 2
