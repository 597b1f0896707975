"""Faults, each a real scenario: kill -9 mid-compile, a corrupt local blob, concurrent builds on one cache,
an unusable cache directory, a remote that dies mid-build, a poisoned remote, read-only mode and tokens.

Nothing is simulated: builds run ninja, the worker and the QNN EP; remotes are real nginx processes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cache_entries, last_build, records, small_tmpfs
from tests._procs import in_group, live_processes, wait_for, with_cwd
from tests.nginx_fixture import find_nginx, start_nginx

ONLY = ("--only", "tiny_cnn_int8", "--only", "mlp_fp16")  # 2 recipes, 6 actions: a build takes ~1.5 s


# --- helpers ---------------------------------------------------------------------------------------

def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def artifacts(out: Path) -> dict[str, str]:
    """Files under OUT's target directories (deliverables and verify results): relative path -> sha256."""
    return {str(p.relative_to(out)): sha(p) for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out).parts[0] != ".ctxbuild" and len(p.relative_to(out).parts) > 1}


def assert_out_consistent(out: Path) -> None:
    """Every action ok, every manifest artifact on disk with its sha256, every model loadable, no temp file."""
    recs = records(out)
    assert recs and all(r["status"] == "ok" for r in recs.values()), {i: r["status"] for i, r in recs.items()}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["artifacts"]
    for a in manifest["artifacts"]:
        p = out / a["path"]
        assert sha(p) == a["sha256"] and p.stat().st_size == a["size"], a["path"]
        if p.suffix == ".onnx":
            onnx.load(p, load_external_data=False)
    for r in recs.values():
        for o in r["outputs"].values():
            assert sha(out / o["path"]) == o["sha256"], o["path"]
    stray = [p for p in out.rglob("*") if ".tmp" in p.name and ".ctxbuild" not in p.relative_to(out).parts]
    assert not stray, stray


def assert_cache_consistent(cache: Path) -> int:
    """Every record in the local cache names blobs that exist and hold their digest. Returns the count."""
    n = 0
    for rec in (cache / "ac").rglob("*"):
        if rec.is_file():
            data = json.loads(rec.read_bytes())
            for digest in [o["digest"] for o in data["outputs"]] + [data["log_digest"]] * bool(data["log_digest"]):
                blob = cache / "cas" / digest[:2] / digest
                assert blob.is_file() and sha(blob) == digest, (rec.name, digest)
            n += 1
    return n


def flip_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.chmod(0o644)
    p.write_bytes(bytes(data))


def start_build(tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`ctxbuild build ARGS` in its own session (so killpg reaches the driver, ninja and the worker)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MAKEFLAGS", None)
    return subprocess.Popen([sys.executable, "-m", "ctxbuild", "build", *args],
                            stdout=open(tmp_path / f"{name}.stdout", "w"), stderr=open(tmp_path / f"{name}.stderr", "w"),
                            env=full_env, cwd=tmp_path, start_new_session=True)


def output_of(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.stdout").read_text() + (tmp_path / f"{name}.stderr").read_text()


# --- a model whose compile takes ~0.6 s, long enough to be killed in the middle of --------------------

def deep_model(layers: int = 100, channels: int = 64, hw: int = 32) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.05)
                                             .astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev = f"r{i}"
    g = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, hw, hw])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, channels, hw, hw])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture(scope="session")
def deep_model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("deep") / "deep.onnx"
    onnx.save(deep_model(), p)
    return p


@pytest.fixture
def deep_tree(tmp_path: Path, deep_model_file: Path) -> Path:
    d = tmp_path / "deep-recipes"
    (d / "models").mkdir(parents=True)
    shutil.copy(deep_model_file, d / "models" / "deep.onnx")
    (d / "deep.yaml").write_text("model: models/deep.onnx\nprecision: fp16\ntargets: [SM8650, SM8750]\nverify: false\n")
    return d


# --- kill -9 ----------------------------------------------------------------------------------------

def test_kill_9_mid_compile_then_rebuild(deep_tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    out = tmp_path / "out"
    p = start_build(tmp_path, "killed", str(deep_tree), "-o", str(out), "-j", "1",
                    env={"CTXBUILD_CACHE_DIR": str(cache_dir)})
    work = out / ".ctxbuild" / "tmp"
    try:
        started = wait_for(lambda: [d for d in work.glob("compile.*") if d.is_dir()], 60, "a compile to start")
        time.sleep(0.2)
        assert p.poll() is None, output_of(tmp_path, "killed")
        os.killpg(p.pid, signal.SIGKILL)
    finally:
        p.wait()
    # Nothing of that build lingers: not the driver's group (ninja, worker, the worker's action children),
    # nor ninja's edge clients (each in a group of its own; they exit once the worker is gone).
    wait_for(lambda: not live_processes(in_group(p.pid)) and not live_processes(with_cwd(out)), 10,
             "the killed build's processes to exit", interval=0.05)
    compile_id = started[0].name.rpartition(".")[0].replace(".", "/", 1)
    assert compile_id not in records(out), "the compile finished before the kill; the test did not test"
    assert assert_cache_consistent(cache_dir) < 3  # prepare (and maybe one compile) only

    r = ctxbuild("build", str(deep_tree), "-o", str(out))
    assert r.code == 0, r.text
    assert last_build(out)[compile_id] == "run"
    assert_out_consistent(out)
    assert not list(work.iterdir()), list(work.iterdir())  # the killed action's work dir was swept
    assert assert_cache_consistent(cache_dir) == cache_entries(out)
    r = ctxbuild("build", str(deep_tree), "-o", str(out))
    assert r.code == 0 and "ctxbuild: up to date" in r.text, r.text


def test_worker_exits_when_its_driver_is_killed(deep_tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    """SIGKILL to the driver alone (not its group): its `finally` never runs, yet the worker must not linger."""
    out = tmp_path / "out"
    p = start_build(tmp_path, "driver", str(deep_tree), "-o", str(out), "-j", "1", "--no-cache")
    try:
        wait_for(lambda: [d for d in (out / ".ctxbuild" / "tmp").glob("compile.*")], 60, "a compile to start")
        workers = live_processes(lambda pid, f: int(f[1]) == p.pid and b"worker" in
                                 Path(f"/proc/{pid}/cmdline").read_bytes())
        assert len(workers) == 1
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait()
    try:
        # ninja (orphaned) finishes its edges; the worker finishes the running action and exits.
        wait_for(lambda: not live_processes(lambda pid, f: pid == workers[0]), 20, "the worker to exit",
                 interval=0.05)
    finally:
        for pid in live_processes(in_group(p.pid)):  # ninja, if still going: ours to stop
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not live_processes(in_group(p.pid)) and not live_processes(with_cwd(out)), 60,
             "the orphaned ninja and its edges to finish", interval=0.05)
    r = ctxbuild("build", str(deep_tree), "-o", str(out), "--no-cache")
    assert r.code == 0, r.text
    assert_out_consistent(out)


# --- the local cache --------------------------------------------------------------------------------

def test_flipped_byte_in_a_cached_blob_is_detected(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--only", "tiny_cnn_int8")
    assert r.code == 0, r.text
    before = artifacts(out)
    digest = records(out)["compile/tiny_cnn_int8@SM8650"]["outputs"]["bin"]["sha256"]
    blob = cache_dir / "cas" / digest[:2] / digest
    flip_byte(blob)
    shutil.rmtree(out)
    r = ctxbuild("build", str(tree), "-o", str(out), "--only", "tiny_cnn_int8")
    assert r.code == 0, r.text
    assert f"warning: local cache blob {digest[:12]} failed its sha256 check; deleted it" in r.text, r.text
    ran = last_build(out)
    assert ran["compile/tiny_cnn_int8@SM8650"] == "run"
    assert {v for k, v in ran.items() if k != "compile/tiny_cnn_int8@SM8650"} == {"cache"}, ran
    assert records(out)["compile/tiny_cnn_int8@SM8650"]["cache_warnings"]
    assert artifacts(out) == before  # the rerun compile gives the same bytes
    assert sha(blob) == digest  # stored again, whole
    assert_out_consistent(out)
    assert_cache_consistent(cache_dir)


def test_two_builds_at_once_share_one_cache(tree: Path, tmp_path: Path, cache_dir: Path) -> None:
    env = {"CTXBUILD_CACHE_DIR": str(cache_dir)}
    builds = [start_build(tmp_path, f"b{i}", str(tree), "-o", str(tmp_path / f"out{i}"), *ONLY, env=env)
              for i in (1, 2)]
    for i, p in enumerate(builds, 1):
        assert p.wait(timeout=300) == 0, output_of(tmp_path, f"b{i}")
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    assert artifacts(out1) and artifacts(out1) == artifacts(out2)
    for out in (out1, out2):
        assert_out_consistent(out)
    assert assert_cache_consistent(cache_dir) == cache_entries(out1, out2)
    r = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(tree), "-o", str(tmp_path / "out3"), *ONLY],
                       env={**os.environ, **env}, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and set(last_build(tmp_path / "out3").values()) == {"cache"}, r.stderr


def test_cache_dir_under_a_regular_file(tree: Path, tmp_path: Path, ctxbuild) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), *ONLY,
                 env={"CTXBUILD_CACHE_DIR": str(blocker / "cache")})
    assert r.code == 0, r.text
    assert f"warning: local cache {blocker / 'cache'} unavailable: Not a directory (continuing without it)" in r.text
    assert "Traceback" not in r.text
    assert set(last_build(tmp_path / "out").values()) == {"run"}
    assert_out_consistent(tmp_path / "out")


@pytest.fixture
def frozen(cache_dir: Path) -> Iterator[callable]:
    if shutil.which("chattr") is None:
        pytest.skip("chattr not installed (e2fsprogs)")

    def freeze() -> None:
        r = subprocess.run(["chattr", "-R", "+i", str(cache_dir)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"chattr +i unsupported here: {r.stderr.strip()}")

    yield freeze
    subprocess.run(["chattr", "-R", "-i", str(cache_dir)], capture_output=True)


def test_read_only_cache_dir_serves_hits_and_builds_the_rest(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path,
                                                             frozen) -> None:
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "a"), *ONLY)
    assert r.code == 0, r.text
    frozen()  # immutable: even root cannot write (os.access would lie to root; chattr does not)
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "b"), *ONLY)
    assert r.code == 0, r.text
    assert set(last_build(tmp_path / "b").values()) == {"cache"}
    recipe = tree / "tiny_cnn_int8.yaml"
    recipe.write_text(recipe.read_text() + "compile:\n  optimization_mode: 2\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "b"), *ONLY)
    assert r.code == 0, r.text
    ran = last_build(tmp_path / "b")
    assert ran["compile/tiny_cnn_int8@SM8650"] == "run" and all(i.endswith("tiny_cnn_int8@SM8650") for i in ran), ran
    assert "unavailable: Operation not permitted (continuing without it)" in r.text, r.text
    assert "Traceback" not in r.text
    assert_out_consistent(tmp_path / "b")


def test_full_cache_dir(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    """A 48 KB tmpfs: the first blobs fit, the 64 KB context binary does not (ENOSPC)."""
    cache_dir.mkdir()
    with small_tmpfs(cache_dir, "size=48k"):
        r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "--only", "tiny_cnn_int8")
        assert r.code == 0, r.text
        assert "unavailable: No space left on device (continuing without it)" in r.text, r.text
        assert "Traceback" not in r.text
        assert_out_consistent(tmp_path / "out")
        assert_cache_consistent(cache_dir)  # whatever made it in is whole
        # A second fresh build still works, from whatever made it in and by running the rest.
        r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out2"), "--only", "tiny_cnn_int8")
        assert r.code == 0, r.text
        assert artifacts(tmp_path / "out2") == artifacts(tmp_path / "out")


# --- the remote cache -------------------------------------------------------------------------------

@pytest.fixture
def remote(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A private nginx (no rate limit): (url, its tmpdir; files under tmpdir/data)."""
    if find_nginx() is None:
        pytest.skip("nginx not installed (Debian package: nginx)")
    d = tmp_path / "nginx"
    url, stop = start_nginx(d)
    yield url, d
    stop()


def server_files(d: Path, sub: str) -> list[Path]:
    return [p for p in (d / "data" / sub).glob("*") if p.is_file()]


def requests(d: Path, method: str) -> int:
    log = d / "access.log"
    return sum(f'"{method} ' in line for line in log.read_text().splitlines()) if log.exists() else 0


def test_remote_dies_mid_build(tree: Path, tmp_path: Path, nginx_server, cache_dir: Path) -> None:
    out = tmp_path / "out"
    p = start_build(tmp_path, "b", str(tree), "-o", str(out), *ONLY, "-j", "1", "--remote-cache", nginx_server.url,
                    env={"CTXBUILD_CACHE_DIR": str(cache_dir)})
    try:
        wait_for(lambda: list((out / ".ctxbuild" / "records").glob("*.json")), 60, "the first action to finish")
        nginx_server.kill()
        assert p.wait(timeout=120) == 0, output_of(tmp_path, "b")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = output_of(tmp_path, "b")
    assert f"warning: remote cache {nginx_server.url} " in text, text
    assert "Traceback" not in text
    recs = records(out)
    assert any(r.get("cache_warnings") for r in recs.values())
    assert_out_consistent(out)
    # The next build knows the server is down (breaker) and does not wait on it.
    shutil.rmtree(out)
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(tree), "-o", str(out), *ONLY, "--remote-cache",
                        nginx_server.url], env={**os.environ, "CTXBUILD_CACHE_DIR": str(cache_dir)},
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t < 30 and set(last_build(out).values()) == {"cache"}


def test_remote_round_trip_and_poisoned_blob(tree: Path, tmp_path: Path, ctxbuild, remote) -> None:
    url, server = remote
    a, b, c = (tmp_path / f"cache-{x}" for x in "abc")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out-a"), *ONLY, "--remote-cache", url,
                 env={"CTXBUILD_CACHE_DIR": str(a)})
    assert r.code == 0, r.text
    assert set(last_build(tmp_path / "out-a").values()) == {"run"}
    n = len(records(tmp_path / "out-a"))
    assert len(server_files(server, "ac")) == cache_entries(tmp_path / "out-a") and requests(server, "PUT") > n
    first = artifacts(tmp_path / "out-a")

    # Another machine: empty local cache, fresh OUT: everything comes from the remote, nothing compiles.
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out-b"), *ONLY, "--remote-cache", url, "--explain",
                 env={"CTXBUILD_CACHE_DIR": str(b)})
    assert r.code == 0, r.text
    assert set(last_build(tmp_path / "out-b").values()) == {"cache"}
    assert {rec["cache_origin"] for rec in records(tmp_path / "out-b").values()} == {"remote"}
    assert r.out.count("restored from cache (remote)") == n, r.out
    assert artifacts(tmp_path / "out-b") == first
    assert assert_cache_consistent(b) == n  # and the local cache now holds it all
    stats = json.loads(ctxbuild("cache", "stats", "--json", env={"CTXBUILD_CACHE_DIR": str(b)}).out)
    assert stats["last_build"]["hits_remote"] == n

    # A poisoned blob on the server: rejected with a warning, the action rebuilt, nothing bad kept locally.
    digest = records(tmp_path / "out-a")["compile/tiny_cnn_int8@SM8650"]["outputs"]["bin"]["sha256"]
    flip_byte(server / "data" / "cas" / digest)
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out-c"), *ONLY, "--remote-cache", url,
                 env={"CTXBUILD_CACHE_DIR": str(c)})
    assert r.code == 0, r.text
    assert f"remote cache {url}: blob {digest[:12]} failed its sha256 check (poisoned or corrupt)" in r.text, r.text
    ran = last_build(tmp_path / "out-c")
    assert ran["compile/tiny_cnn_int8@SM8650"] == "run", ran
    assert sum(v == "run" for v in ran.values()) == 1, ran
    assert artifacts(tmp_path / "out-c") == first
    assert_out_consistent(tmp_path / "out-c")
    assert_cache_consistent(c)
    # ... and the rebuild replaced the bad blob on the server: the next client restores everything.
    assert sha(server / "data" / "cas" / digest) == digest
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out-d"), *ONLY, "--remote-cache", url,
                 env={"CTXBUILD_CACHE_DIR": str(tmp_path / "cache-d")})
    assert r.code == 0 and set(last_build(tmp_path / "out-d").values()) == {"cache"}, r.text


def test_remote_read_only_never_puts(tree: Path, tmp_path: Path, ctxbuild, remote) -> None:
    url, server = remote
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out-a"), *ONLY, "--remote-cache", url,
                 "--remote-read-only", env={"CTXBUILD_CACHE_DIR": str(tmp_path / "ca")})
    assert r.code == 0, r.text
    assert requests(server, "GET") > 0 and requests(server, "PUT") == 0
    assert not server_files(server, "ac") and not server_files(server, "cas")
    # Filled by a trusted build, read by an untrusted one: hits, and still no PUT from it.
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out-b"), *ONLY, "--remote-cache", url,
                 env={"CTXBUILD_CACHE_DIR": str(tmp_path / "cb")})
    assert r.code == 0, r.text
    puts = requests(server, "PUT")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out-c"), *ONLY, "--remote-cache", url,
                 "--remote-read-only", env={"CTXBUILD_CACHE_DIR": str(tmp_path / "cc")})
    assert r.code == 0, r.text
    assert set(last_build(tmp_path / "out-c").values()) == {"cache"}
    assert requests(server, "PUT") == puts


def test_remote_token_from_env_is_never_printed(tree: Path, tmp_path: Path, ctxbuild) -> None:
    if find_nginx() is None:
        pytest.skip("nginx not installed (Debian package: nginx)")
    token = "s3cr3t-" + os.urandom(8).hex()
    url, stop = start_nginx(tmp_path / "nginx", token)
    try:
        out = tmp_path / "out"
        r = ctxbuild("build", str(tree), "-o", str(out), *ONLY, "--remote-cache", url,
                     env={"CTXBUILD_REMOTE_TOKEN": token})
        assert r.code == 0, r.text
        assert len(server_files(tmp_path / "nginx", "ac")) == cache_entries(out)  # the token worked
        bad = "wr0ng-" + os.urandom(8).hex()
        r2 = ctxbuild("build", str(tree), "-o", str(tmp_path / "out2"), *ONLY, "--remote-cache", url,
                      env={"CTXBUILD_REMOTE_TOKEN": bad, "CTXBUILD_CACHE_DIR": str(tmp_path / "other-cache")})
        assert r2.code == 0, r2.text
        assert f"remote cache {url} answered HTTP 401 (missing or wrong token)" in r2.text, r2.text
        for text in (r.text, r2.text):
            assert token not in text and bad not in text
        for d in (out, tmp_path / "out2", tmp_path / "cache", tmp_path / "other-cache"):
            for p in d.rglob("*"):
                if p.is_file():
                    data = p.read_bytes()
                    assert token.encode() not in data and bad.encode() not in data, p
    finally:
        stop()
