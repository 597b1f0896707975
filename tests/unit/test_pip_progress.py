"""Issue 48: the first provisioning of a toolchain was minutes of silence after one line. pip's own output
(`--progress-bar raw`) is read while it runs: which package, how many bytes of it, how many packages are done; on a
terminal one status line, elsewhere a line every few seconds. Run here on real pip, installing two wheels from a
local HTTP server (no registry is asked)."""
from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import os
import sys
import threading
import zipfile
from pathlib import Path

from ctxbuild.toolchain.pipprogress import PipProgress, megabytes, run_pip


def _wheel(d: Path, name: str, size: int) -> Path:
    """A minimal valid pure-Python wheel holding `size` random bytes."""
    files = {f"{name}/__init__.py": b"", f"{name}/blob.bin": os.urandom(size),
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             b"Tag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for p, b in files.items()) + f"{name}-1.0.dist-info/RECORD,,\n"
    path = d / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, b in {**files, f"{name}-1.0.dist-info/RECORD": record.encode()}.items():
            z.writestr(p, b)
    return path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_pip_install_says_packages_and_bytes(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    sizes = {"alpha": 3_000_000, "beta": 2_000_000}
    wheels = {n: _wheel(served, n, s).stat().st_size for n, s in sizes.items()}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_NO_CACHE_DIR": "1"}
        for tty in (True, False):
            said: list[str] = []
            shown: list[str] = []
            cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--no-index",
                   "--find-links", f"http://127.0.0.1:{server.server_port}/", "--target", str(tmp_path / f"t{tty}"),
                   "alpha", "beta"]
            p = run_pip(cmd, 2, said.append, shown.append if tty else None, every=0.0, env=env)
            assert p.returncode == 0, p.stderr
            beats = [s for s in said if s.endswith(" s")]  # every 0 s: each second pip is silent has its line
            said = [s for s in said if s not in beats]
            assert (tmp_path / f"t{tty}" / "alpha" / "blob.bin").stat().st_size == sizes["alpha"]
            assert said[0] == "ctxbuild: toolchain: downloading alpha-1.0-py3-none-any.whl (3.0 MB), package 1 of 2"
            assert said[-1].startswith(f"ctxbuild: toolchain: downloaded {megabytes(sum(wheels.values()))}; installing ")
            assert "ctxbuild: toolchain: downloading beta-1.0-py3-none-any.whl (2.0 MB), package 2 of 2" in said
            status = shown if tty else beats  # a terminal's status line, else lasting lines (every 0 s here)
            assert any(s.startswith("ctxbuild: toolchain: downloading alpha-1.0-py3-none-any.whl: 3.0 MB of 3.0 MB")
                       for s in status), status
    finally:
        server.shutdown()


def test_off_a_terminal_a_line_every_interval_while_pip_is_silent() -> None:
    now = [0.0]
    said: list[str] = []
    progress = PipProgress(2, said.append, None, every=10.0, clock=lambda: now[0])
    progress.feed("  Downloading onnxruntime_qnn-2.3.0-cp311-cp311-manylinux_2_35_x86_64.whl (98.7 MB)")
    for t, got in ((1.0, 0), (5.0, 40_000_000), (12.0, 60_000_000)):
        now[0] = t
        progress.feed(f"Progress {got} of 98_700_000".replace("_", ""))
    assert said == ["ctxbuild: toolchain: downloading onnxruntime_qnn-2.3.0-cp311-cp311-manylinux_2_35_x86_64.whl "
                    "(98.7 MB), package 1 of 2",
                    "ctxbuild: toolchain: downloading onnxruntime_qnn-2.3.0-cp311-cp311-manylinux_2_35_x86_64.whl: "
                    "60.0 MB of 98.7 MB, 12 s"]
    progress.feed("Installing collected packages: onnxruntime-qnn")
    now[0] = 30.0
    progress.heartbeat()  # unpacking: pip says nothing for a while
    assert said[-2:] == ["ctxbuild: toolchain: downloaded 98.7 MB; installing onnxruntime-qnn (unpacking)",
                         "ctxbuild: toolchain: installing (unpacking), 30 s"]
