"""Toolchain versions and the QNN EP: what goes into every action key, and how actions reach the EP.

`site` arguments name a provisioned toolchain's site directory (toolchain/provision.py), searched before
sys.path: the driver keys a toolchain's actions without running in it. None: the path as it is (inside a
toolchain's worker, its site is already first)."""
from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from ctxbuild import settings
from ctxbuild.atomic import write_bytes
from ctxbuild.capture import captured
from ctxbuild.layout import cache_dir

EP_NAME = "QNNExecutionProvider"
LIBRARIES = ("libQnnHtp.so", "libHtpPrepare.so", "libonnxruntime_providers_qnn.so")  # what a QNN change changes


@lru_cache(maxsize=None)
def version(dist: str, site: str | None = None) -> str:
    found = _dist_info(dist, site)
    if found is not None:
        return found[1]
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "missing"


@lru_cache(maxsize=None)
def qnn_library_dir(site: str | None = None) -> Path:
    """Directory of the onnxruntime-qnn wheel's shared libraries (found without importing onnxruntime)."""
    found = _dist_info("onnxruntime-qnn", site)
    if found is not None:
        return Path(found[0]) / "onnxruntime_qnn"
    from importlib import metadata

    return Path(str(metadata.distribution("onnxruntime-qnn").locate_file("onnxruntime_qnn")))


@lru_cache(maxsize=None)
def _dist_info(dist: str, site: str | None = None) -> tuple[str, str] | None:
    """(directory, version) of the first `<name>-<version>.dist-info` on sys.path, as importlib.metadata
    finds an installed wheel, without importing it (~14 ms of a 0.3 s restore). Names compare normalized
    (the packaging spec: lower case, runs of - _ . as one _). None: let importlib.metadata look."""
    want = re.sub(r"[-_.]+", "_", dist).lower()
    for d, names in _site_listings([site] if site else []):
        for n in names:
            name, _, ver = n.removesuffix(".dist-info").partition("-")
            if n.endswith(".dist-info") and ver and re.sub(r"[-_.]+", "_", name).lower() == want:
                return d or ".", ver
    return None


def library_files(site: str | None = None) -> list[Path]:
    """Files whose change means a different compiler: generator-edge inputs, and the SDK id memo's stamp."""
    return [qnn_library_dir(site) / name for name in LIBRARIES]


@lru_cache(maxsize=None)  # per process: a build keys 50-150 actions; a toolchain swapped mid-build is not supported
def _stamp(site: str | None) -> list[Any]:
    return [version("onnxruntime", site), version("onnxruntime-qnn", site)] + [
        [f.name, s.st_size, s.st_mtime_ns] for f in library_files(site) for s in [f.stat()]
    ]


def site_of(toolchain: str | None) -> str | None:
    """The site directory of the toolchain an action spec names (None: the installed one)."""
    if toolchain is None:
        return None
    from ctxbuild.toolchain import choose, provision

    return str(provision.site(choose.by_name(toolchain)))


def sdk_build_id(out_state: Path | None, toolchain: str | None = None) -> str:
    """The QNN SDK build id (`ep_sdk_version`) the EP stamps into context binaries, memoized per toolchain.

    The memo lives in the user cache dir (a fresh OUT must not pay the ~0.3 s probe), else in OUT
    (`out_state`; None outside a build, e.g. `ctxbuild --version`).
    """
    return _sdk_build_id(cache_dir(), out_state, site_of(toolchain))


@lru_cache(maxsize=None)  # per process, as the stamp: keying 50 restored actions read the memo file 50 times
def _sdk_build_id(cache: Path, out_state: Path | None, site: str | None) -> str:
    stamp = _stamp(site)
    memo_name = "toolchain.json" if site is None else f"toolchain-{Path(site).parent.name}.json"
    memos = [cache / memo_name] + ([out_state / memo_name] if out_state is not None else [])
    for memo in memos:
        try:
            data = json.loads(memo.read_text())
            if data["stamp"] == stamp:
                return data["sdk_build_id"]
        except (OSError, ValueError, KeyError):
            continue
    build_id = _probe_sdk_build_id(site)
    for memo in memos:  # both: a later build may have an empty cache dir, or a fresh OUT
        try:
            write_bytes(memo, json.dumps({"stamp": stamp, "sdk_build_id": build_id}).encode())
        except OSError:
            continue  # read-only or full cache dir: the OUT copy serves
    return build_id


def _probe_sdk_build_id(site: str | None) -> str:
    """probe_sdk_build_id in a child process. Compiling here would advance QNN's process-wide tensor id
    counter (the probe's three tensors), and every later compile in this process, or in a process forked from
    it, would number its tensors from there: another binary for the same key (measured: a LoRA compile on a
    Dask worker whose host cache had lost this memo, ids shifted by 3)."""
    import subprocess
    import sys

    from ctxbuild.errors import ActionError

    code = "from ctxbuild.toolchain.installed import probe_sdk_build_id; print(probe_sdk_build_id())"
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        raise ActionError(f"the QNN SDK version probe did not run: {e}") from None
    lines = p.stdout.split()
    if p.returncode != 0 or not lines:  # never memoized: the next build probes again
        from ctxbuild.errors import cause_line, machine_limit

        tail = cause_line(p.stderr, last=True)
        limited = machine_limit(RuntimeError(tail))  # a file-size limit the child met: say so, one line
        raise ActionError(f"the QNN SDK version probe failed (exit {p.returncode}): {limited or tail}")
    return lines[-1]


def probe_sdk_build_id() -> str:
    """Compile a one-node model and read the SDK version the EP writes: exactly what artifacts will carry.
    Run only in a process of its own (_probe_sdk_build_id)."""
    import tempfile

    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("c", TensorProto.FLOAT, [1, 4], np.ones(4, np.float32).tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with tempfile.TemporaryDirectory(prefix="ctxbuild-probe-") as tmp:
        src, dst = Path(tmp) / "probe.onnx", Path(tmp) / "probe_ctx.onnx"
        onnx.save(model, src)
        with captured(None):  # the EP's banner and warnings are noise here
            compile_model(src, dst, {"soc_model": "57", "htp_arch": "75", "enable_htp_fp16_precision": "1"},
                          embed=False, cpu_fallback=False)
        for node in onnx.load(dst).graph.node:
            for a in node.attribute:
                if a.name == "ep_sdk_version":
                    return a.s.decode()
    return "unknown"


def quick_stamp(toolchains: tuple[str, ...] = ()) -> list[Any]:
    """Everything `fingerprint` depends on, read with directory listings and a few stats instead of
    importlib.metadata (~30 ms to import): the toolchain packages' dist-info names (they carry the versions)
    and the QNN libraries' stats, on the path and in each provisioned toolchain named. Unchanged stamp,
    unchanged fingerprints; the no-op build checks only this."""
    found: list[Any] = []
    for d, names in _site_listings([s for t in toolchains if (s := site_of(t))]):
        found += [[d, n] for n in names if n.endswith(".dist-info")
                  and n.startswith(("onnx-", "onnxruntime-", "onnxruntime_qnn-"))]
        if "onnxruntime_qnn" in names:
            libs = [os.path.join(d, "onnxruntime_qnn", name) for name in LIBRARIES]
            found += [[f, st.st_size, st.st_mtime_ns] for f in libs for st in _stats(f)]
    return found


def _site_listings(first: list[str] | None = None) -> Iterator[tuple[str, list[str]]]:
    """Each readable directory of `first` (provisioned toolchains' sites), then of sys.path, with its sorted
    listing, in import order."""
    for d in [*(first or []), *sys.path]:
        try:
            yield d, sorted(os.listdir(d or "."))
        except OSError:
            continue


def _stats(f: str) -> list[os.stat_result]:
    try:
        return [os.stat(f)]
    except OSError:
        return []


def summary(out_state: Path | None) -> dict[str, str]:
    """The installed toolchain, for the manifest (artifacts a provisioned one made name it themselves)."""
    return {"onnx": version("onnx"), "onnxruntime": version("onnxruntime"),
            "onnxruntime-qnn": version("onnxruntime-qnn"), "qnn_sdk_build_id": sdk_build_id(out_state)}


# --- the EP -----------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def qnn_devices() -> list[Any]:
    """Register the QNN plugin EP once per process (unregistering resets shared contexts: see QNN-NOTES)."""
    import onnxruntime as ort
    import onnxruntime_qnn

    ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
    return [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]


def session_options(provider_options: dict[str, str], *, cpu_fallback: bool,
                    config: dict[str, str] | None = None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = settings.ORT_LOG_LEVEL.get()
    if not cpu_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices(qnn_devices(), {"backend_type": "htp", **provider_options})
    return so


def compile_model(src: Path, dst: Path, provider_options: dict[str, str], *, embed: bool, cpu_fallback: bool,
                  config: dict[str, str] | None = None) -> None:
    """ModelCompiler: writes `dst` (EPContext wrapper) and, unless embedded, `<dst stem>_qnn.bin` beside it.

    The EP derives the partition (graph) name and bits of the binary from `src`'s path: actions pass a
    path from staging.fixed_dir, so outputs are byte-identical wherever they are built (measured, 2.7.0).
    A path, not bytes: only a path lets ORT find external data (weights over 2 GB).
    """
    import onnxruntime as ort

    so = session_options(provider_options, cpu_fallback=cpu_fallback, config=config)
    ort.ModelCompiler(so, str(src), embed_compiled_data_into_model=embed).compile_to_file(str(dst))
