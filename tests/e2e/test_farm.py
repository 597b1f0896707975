"""Remote execution on a real local Dask cluster (`dask scheduler` + `dask worker` processes on 127.0.0.1)
with a real nginx remote cache as the data plane, and the real toolchain on the workers."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES_IGNORE, RECIPES, records
from tests._procs import in_group, live_processes, wait_for
from tests.dask_fixture import Cluster, ClusterUnavailable, free_port, start_cluster
from tests.nginx_fixture import find_nginx, start_nginx

GOOD = "qnn=1,mem_gb=8"
BIG = "qnn=1,mem_gb=16"
# QNN's multi-SoC binary differs between two *local* builds too (its zip members are not reproducible), so it
# cannot be compared byte for byte; everything else must be identical.
NOT_REPRODUCIBLE = {"SC8380XP+SM8750/tiny_cnn_flex/tiny_cnn_flex_ctx_qnn.bin"}


def _cluster(tmp: Path, workers: dict[str, tuple[str, dict[str, str] | None]]) -> Cluster:
    try:
        cluster = start_cluster(tmp)
    except ClusterUnavailable as e:
        pytest.skip(f"dask cannot start here: {e}")
    try:
        cluster.add_workers(workers)
    except ClusterUnavailable as e:
        cluster.stop()
        pytest.skip(f"dask worker cannot start here: {e}")
    return cluster


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[str]:
    """An empty nginx cache per test: a shared one would turn later tests' actions into cache hits."""
    if find_nginx() is None:
        pytest.skip("nginx not installed (Debian package: nginx)")
    url, stop = start_nginx(tmp_path / "nginx")
    yield url
    stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Two workers with different resources, for a test that breaks them."""
    c = _cluster(tmp_path / "dask", {"a": (GOOD, None), "b": (BIG, None)})
    yield c
    c.stop()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The same, shared by the tests that leave it whole (each has its own empty remote cache)."""
    c = _cluster(tmp_path_factory.mktemp("dask"), {"a": (GOOD, None), "b": (BIG, None)})
    yield c
    c.stop()


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> Path:
    """The examples built locally, without a cache: what the cluster's outputs must equal."""
    tree = _copy_tree(tmp_path_factory.mktemp("local"), example_models)
    out = tree.parent / "out"
    r = _run(["build", str(tree), "-o", str(out), "--no-cache"], tree.parent / "cache")
    assert r.returncode == 0, r.stderr
    return out


def _copy_tree(dst: Path, models: Path) -> Path:
    tree = dst / "recipes"
    shutil.copytree(RECIPES, tree, ignore=EXAMPLES_IGNORE)
    shutil.copytree(models, tree / "models")
    return tree


def _run(args: list[str], cache: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache), **(env or {})}
    full.pop("MAKEFLAGS", None)
    return subprocess.run([sys.executable, "-m", "ctxbuild", *args], capture_output=True, text=True, env=full,
                          timeout=timeout)


def _farm_args(tree: Path, out: Path, cluster: Cluster, remote: str, *extra: str) -> list[str]:
    return ["build", str(tree), "-o", str(out), "--executor", cluster.address, "--remote-cache", remote, *extra]


def _outputs(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*")
            if p.is_file() and ".ctxbuild" not in p.parts and p.suffix in (".onnx", ".bin", ".json")
            and p.name not in ("manifest.json", "report.json")}


def _wait_for_work(build: subprocess.Popen, cluster: Cluster, scratch: str, timeout: float = 120) -> None:
    """Until a Dask worker has a scratch dir matching `scratch` (that action is running there), the build
    ended, or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and build.poll() is None:
        if any(cluster.scratch_dirs(n, scratch) for n in cluster.workers):
            return
        time.sleep(0.01)


def _no_temps(out: Path) -> None:
    leftovers = [p for p in out.rglob("*") if ".tmp" in p.name and ".ctxbuild" not in p.parts]
    assert not leftovers, leftovers


def test_examples_through_cluster_identical_to_local(tmp_path: Path, example_models: Path, shared_cluster: Cluster,
                                                     remote: str, local_reference: Path) -> None:
    cluster = shared_cluster
    tree = _copy_tree(tmp_path, example_models)
    out = tmp_path / "out"
    r = _run(_farm_args(tree, out, cluster, remote), tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    recs = records(out)
    assert recs and all(rec["cache_origin"] == "farm" for rec in recs.values())  # nothing ran here
    used = {rec["farm"]["worker"] for rec in recs.values()}
    assert used == {cluster.workers["a"].address, cluster.workers["b"].address}
    got, want = _outputs(out), _outputs(local_reference)
    assert sorted(got) == sorted(want)
    differ = sorted(name for name in want if got[name] != want[name])
    assert set(differ) <= NOT_REPRODUCIBLE, differ
    _no_temps(out)


def test_worker_killed_mid_compile_is_survived(tmp_path: Path, example_models: Path, cluster: Cluster, remote: str,
                                               local_reference: Path) -> None:
    tree = _copy_tree(tmp_path, example_models)
    out = tmp_path / "out"
    build = subprocess.Popen([sys.executable, "-m", "ctxbuild", *_farm_args(tree, out, cluster, remote,
                                                                          "--only", "tiny_cnn", "--no-verify")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "CTXBUILD_CACHE_DIR": str(tmp_path / "cache")})
    victim = None
    deadline = time.monotonic() + 120
    while victim is None and time.monotonic() < deadline and build.poll() is None:
        for name in cluster.workers:  # a compile whose action process has started (its log exists)
            if any(cluster.scratch_dirs(name, "compile.tiny_cnn@*/out/.ctxbuild/logs/*.log")):
                victim = name
                break
        else:
            time.sleep(0.01)
    assert victim is not None, "no compile seen on a worker"
    cluster.workers[victim].kill()
    stdout, stderr = build.communicate(timeout=300)
    assert build.returncode == 0, stderr
    survivor = cluster.workers["b" if victim == "a" else "a"].address
    compiles = [rec for rec in records(out).values() if rec["kind"] == "compile"]
    assert compiles and survivor in {rec["farm"]["worker"] for rec in compiles}
    got, want = _outputs(out), _outputs(local_reference)
    assert got and all(got[name] == want[name] for name in got)
    _no_temps(out)


def test_mismatched_toolchain_worker_is_never_used(tmp_path: Path, example_models: Path, remote: str) -> None:
    other = {"CTXBUILD_TOOLCHAIN_OVERRIDE": json.dumps({"qnn_sdk": "v0.0.other"})}
    cluster = _cluster(tmp_path / "dask", {"good": (GOOD, None), "other": (BIG, other)})
    try:
        tree = _copy_tree(tmp_path, example_models)
        r = _run(_farm_args(tree, tmp_path / "out", cluster, remote, "--only", "mlp_fp16", "--no-verify"),
                 tmp_path / "cache")
        assert r.returncode == 0, r.stderr
        used = {rec["farm"]["worker"] for rec in records(tmp_path / "out").values()}
        assert used == {cluster.workers["good"].address}
        # With only the mismatched worker left, an action fails and names both fingerprints.
        cluster.workers["good"].kill()
        (tree / "mlp_fp16.yaml").write_text((tree / "mlp_fp16.yaml").read_text() + "targets: [SM8550]\n")
        r = _run(_farm_args(tree, tmp_path / "out2", cluster, remote, "--only", "mlp_fp16", "--no-verify"),
                 tmp_path / "cache")
        assert r.returncode == 1
        assert "no Dask worker has the toolchain" in r.stderr and "v0.0.other" in r.stderr, r.stderr
        assert _local_fingerprint_sdk() in r.stderr
        # The worker's own check, should a task reach it anyway: both fingerprints named, nothing run.
        from distributed import Client

        from ctxbuild.engine.farm.task import run_action

        with Client(cluster.address, set_as_default=False) as client:
            reply = client.submit(run_action, {"action": {"kind": "compile", "id": "compile/x@SM8650"},
                                               "fingerprint": {"qnn_sdk": "v9"}}, pure=False).result(60)
        assert reply["status"] == "failed" and "v0.0.other" in reply["cause"] and "v9" in reply["cause"]
    finally:
        cluster.stop()


def _local_fingerprint_sdk() -> str:
    from ctxbuild.toolchain import installed as toolchain
    from ctxbuild.layout import cache_dir

    return toolchain.sdk_build_id(cache_dir())


def test_deterministic_failure_is_not_retried(tmp_path: Path, example_models: Path, shared_cluster: Cluster,
                                              remote: str) -> None:
    cluster = shared_cluster
    import onnx

    from tests._qnn_models import nonzero_model

    tree = _copy_tree(tmp_path, example_models)
    onnx.save(nonzero_model(), tree / "models" / "nz.onnx")
    (tree / "bad.yaml").write_text("model: models/nz.onnx\nprecision: fp16\ntargets: [SM8650]\nverify: false\n")
    r = _run(_farm_args(tree, tmp_path / "out", cluster, remote, "--only", "bad"), tmp_path / "cache")
    assert r.returncode == 1
    assert "QNN cannot run 1 node(s): find_nonzero (NonZero)" in r.stderr, r.stderr
    assert "dask-scratch-space" not in r.stderr  # the worker's scratch paths are mapped back to ours
    rec = records(tmp_path / "out")["compile/bad@SM8650"]
    assert rec["status"] == "failed"
    from distributed import Client

    def processing_starts(prefix: str, dask_scheduler=None) -> int:  # type: ignore[no-untyped-def]
        """How often the scheduler sent a task whose key starts with `prefix` to a worker (nested: pickled
        by value, the scheduler cannot import this module)."""
        return sum(1 for e in dask_scheduler.transition_log if str(e[0]).startswith(prefix) and e[2] == "processing")

    with Client(cluster.address, set_as_default=False) as client:
        starts = client.run_on_scheduler(processing_starts, "ctxbuild-compile/bad@SM8650")
    assert starts == 1
    assert not list((tmp_path / "out").glob("SM8650/bad/*"))


def test_unreachable_scheduler_is_a_clear_error_or_falls_back(tmp_path: Path, example_models: Path,
                                                             remote: str) -> None:
    tree = _copy_tree(tmp_path, example_models)
    dead = f"tcp://127.0.0.1:{free_port()}"
    args = ["build", str(tree), "-o", str(tmp_path / "out"), "--only", "mlp_fp16", "--no-verify", "--executor", dead]
    r = _run(args, tmp_path / "cache")
    assert r.returncode == 2 and "needs a writable remote cache" in r.stderr, r.stderr
    r = _run([*args, "--remote-cache", remote], tmp_path / "cache")
    assert r.returncode == 1
    assert f"the Dask scheduler at {dead} is unreachable" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out" / "SM8650" / "mlp_fp16").exists()
    r = _run([*args, "--remote-cache", remote], tmp_path / "cache", env={"CTXBUILD_EXECUTOR_FALLBACK": "local"})
    assert r.returncode == 0, r.stderr
    assert "building locally" in r.stderr
    assert all("farm" not in rec for rec in records(tmp_path / "out").values())
    # `executor:` in _defaults.yaml, next to `cache:`; a malformed one is a recipe error (exit 2).
    defaults = tree / "_defaults.yaml"
    base = defaults.read_text()
    defaults.write_text(base + f"executor: {dead}\ncache: {{remote: {remote}}}\n")
    r = _run(args[:-2], tmp_path / "cache")
    assert r.returncode == 1 and f"the Dask scheduler at {dead} is unreachable" in r.stderr, r.stderr
    defaults.write_text(base + "executor: 127.0.0.1:8786\n")
    r = _run(args[:-2], tmp_path / "cache")
    assert r.returncode == 2 and "_defaults.yaml" in r.stderr and "executor" in r.stderr, r.stderr


def test_task_resources_follow_the_cluster() -> None:
    from ctxbuild.engine.farm import resources

    fp = {"onnxruntime": "1", "qnn_sdk": "v2"}
    workers = {"a": {"nthreads": 4, "resources": {"qnn": 1, "mem_gb": 8}}, "b": {"nthreads": 2, "resources": {}}}
    assert resources.slots(workers) == 1 + 2
    big = resources.largest(workers)
    want = resources.task_resources("compile", fp, 4 << 30, big)
    assert want == {resources.toolchain_resource(fp): 1, "qnn": 1, "mem_gb": 8.0}  # capped at the biggest worker
    small = resources.task_resources("prepare", fp, 1 << 20, big)
    assert "qnn" not in small and small["mem_gb"] == resources.estimate_mem_gb("prepare", 1 << 20)
    assert resources.estimate_mem_gb("prepare", 1 << 30) < resources.estimate_mem_gb("compile", 1 << 30)
    # A cluster without the resources: only the toolchain is asked for (else the task would wait forever).
    assert resources.task_resources("compile", fp, 1 << 30, {}) == {resources.toolchain_resource(fp): 1}
    assert resources.toolchain_resource(fp) != resources.toolchain_resource({**fp, "qnn_sdk": "v3"})


@pytest.mark.parametrize("fallback", ["fail", "local"])
def test_scheduler_gone_mid_build(tmp_path: Path, example_models: Path, cluster: Cluster, remote: str,
                                  fallback: str) -> None:
    """Fails with one clear line per action, or (asked for) builds the rest locally."""
    tree = _copy_tree(tmp_path, example_models)
    build = subprocess.Popen([sys.executable, "-m", "ctxbuild", *_farm_args(tree, tmp_path / "out", cluster, remote,
                                                                          "--only", "mlp_fp16",
                                                                          "--executor-fallback", fallback)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "CTXBUILD_CACHE_DIR": str(tmp_path / "cache")})
    _wait_for_work(build, cluster, "prepare.*")
    cluster.scheduler.kill()
    _, stderr = build.communicate(timeout=180)
    assert "Traceback" not in stderr, stderr
    if fallback == "fail":
        assert build.returncode == 1
        assert f"the Dask scheduler at {cluster.address} went away" in stderr, stderr
    else:
        assert build.returncode == 0, stderr
        assert f"the Dask scheduler at {cluster.address} went away during the build" in stderr, stderr
        assert any("farm" not in rec for rec in records(tmp_path / "out").values())
    _no_temps(tmp_path / "out")


def test_ctrl_c_cancels_submitted_work(tmp_path: Path, example_models: Path, shared_cluster: Cluster,
                                       remote: str) -> None:
    cluster = shared_cluster
    tree = _copy_tree(tmp_path, example_models)
    build = subprocess.Popen([sys.executable, "-m", "ctxbuild", *_farm_args(tree, tmp_path / "out", cluster, remote)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env={**os.environ, "CTXBUILD_CACHE_DIR": str(tmp_path / "cache")})
    _wait_for_work(build, cluster, "quantize.*")
    os.killpg(build.pid, signal.SIGINT)  # what a terminal's ctrl-C does
    build.communicate(timeout=60)
    assert build.returncode != 0
    # nothing of the build lingers: not the worker (it once hung in onnxruntime's exit handlers), not an action
    wait_for(lambda: not live_processes(in_group(build.pid)), 20, "the build's processes to exit")
    from distributed import Client

    def ctxbuild_tasks(dask_scheduler=None) -> list[str]:  # type: ignore[no-untyped-def]
        return [str(k) for k in dask_scheduler.tasks if str(k).startswith("ctxbuild-")]

    with Client(cluster.address, set_as_default=False) as client:
        deadline = time.monotonic() + 30
        while client.run_on_scheduler(ctxbuild_tasks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.run_on_scheduler(ctxbuild_tasks) == []
    _no_temps(tmp_path / "out")



def test_lora_repeated_on_one_worker_identical_to_local(tmp_path: Path, example_models: Path, remote: str,
                                                        local_reference: Path) -> None:
    """Issue 19 item 4: the LoRA recipe built three times on the same Dask worker process (its host cache
    emptied in between, so every action runs again there) gives the local build's bytes every time."""
    from tests.nginx_fixture import start_nginx

    c = _cluster(tmp_path / "dask", {"only": (GOOD, None)})
    try:
        for i in range(3):
            url, stop = (remote, None) if i == 0 else start_nginx(tmp_path / f"nginx{i}")  # an empty remote cache
            try:
                shutil.rmtree(c.tmp / "worker-cache", ignore_errors=True)
                tree = _copy_tree(tmp_path / f"run{i}", example_models)
                out = tmp_path / f"out{i}"
                r = _run(_farm_args(tree, out, c, url, "--only", "lora_mlp", "--target", "SM8650"),
                         tmp_path / f"cache{i}")
                assert r.returncode == 0, r.stderr
                assert all(rec["cache_origin"] == "farm" for rec in records(out).values())
                got, want = _outputs(out), _outputs(local_reference)
                differ = sorted(name for name in got if got[name] != want[name])
                assert not differ, (i, differ)
            finally:
                if stop is not None:
                    stop()
    finally:
        c.stop()


def test_a_provisioned_toolchain_runs_only_where_a_worker_has_it(tmp_path: Path, example_models: Path,
                                                                 remote: str) -> None:
    """Worker `bare` has no toolchains (its own empty toolchains dir); `tc` has onnxruntime-qnn 2.3.0. A recipe
    built with 2.3.0 runs every action on `tc`, in that toolchain, with the local build's bytes."""
    from ctxbuild.errors import UsageError
    from ctxbuild.toolchain import choose, provision

    try:
        provision.ensure(choose.Toolchain("2.3.0"), say=print)
    except UsageError as e:
        pytest.skip(f"onnxruntime-qnn 2.3.0 cannot be provisioned here (offline?): {e}")
    bare = {"CTXBUILD_TOOLCHAINS_DIR": str(tmp_path / "no-toolchains")}
    cluster = _cluster(tmp_path / "dask", {"bare": (GOOD, bare), "tc": (GOOD, None)})
    try:
        tree = _copy_tree(tmp_path, example_models)
        for p in tree.glob("*.yaml"):
            if p.name not in ("tiny_cnn_int8.yaml", "_defaults.yaml"):
                p.unlink()
        (tree / "tiny_cnn_int8.yaml").write_text((tree / "tiny_cnn_int8.yaml").read_text() + 'toolchain: "2.3.0"\n')
        r = _run(_farm_args(tree, tmp_path / "out", cluster, remote), tmp_path / "cache")
        assert r.returncode == 0, r.stderr
        recs = records(tmp_path / "out")
        assert recs and {rec["farm"]["worker"] for rec in recs.values()} == {cluster.workers["tc"].address}
        compile_key = next(rec for rec in recs.values() if rec["kind"] == "compile")["key_detail"]["toolchain"]
        assert compile_key["onnxruntime-qnn"] == "2.3.0" and compile_key["qnn_sdk"].startswith("v2.47.0.")
        local = tmp_path / "local"
        r = _run(["build", str(tree), "-o", str(local), "--no-cache"], tmp_path / "cache2")
        assert r.returncode == 0, r.stderr
        assert _outputs(tmp_path / "out") == _outputs(local)
    finally:
        cluster.stop()
