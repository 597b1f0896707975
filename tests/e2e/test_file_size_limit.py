"""A file-size limit (EFBIG) fails the build with one line naming the limit, like a full disk (issue 19,
item 13): it gave full tracebacks, from the driver's toolchain probe and from every action's log."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import keep_only

LIMIT = 30_000  # bytes: the example models' prepared copies and binaries are bigger


def _limited(args: list[str], cache_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer; ignored: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(cache_dir)}
    env.pop("MAKEFLAGS", None)
    return subprocess.run([sys.executable, "-m", "ctxbuild", *args], preexec_fn=limit, capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


def _one_line_failure(p: subprocess.CompletedProcess[str]) -> None:
    text = p.stdout + p.stderr
    assert p.returncode == 1, text
    assert "Traceback" not in text, text
    assert f"`ulimit -f`, is {LIMIT} bytes" in text, text


def test_limit_hit_by_the_toolchain_probe(tree: Path, tmp_path: Path, cache_dir: Path) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    _one_line_failure(_limited(["build", str(tree), "-o", str(tmp_path / "out"), "--no-verify"], cache_dir, tmp_path))


def test_limit_hit_by_an_action(tree: Path, tmp_path: Path, cache_dir: Path, ctxbuild) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    assert ctxbuild("--version").code == 0  # the toolchain probe's memo, written without the limit
    p = _limited(["build", str(tree), "-o", str(tmp_path / "out"), "--no-verify"], cache_dir, tmp_path)
    _one_line_failure(p)
    assert "File too large" in p.stdout + p.stderr
