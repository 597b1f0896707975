"""Multi-hundred-MB outputs through the local and remote caches with bounded memory: store, restore and
download stream (1 MB pieces), never reading a blob whole into Python. Each round trip runs in a fresh
child process whose peak RSS growth is measured (ru_maxrss before and after)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

pytest_plugins = ["tests.nginx_fixture"]

SIZE = 192 << 20
CHILD = """
import json, resource, sys
from pathlib import Path
from ctxbuild.cache import Cache, LocalStore, RemoteStore
from ctxbuild.cache.files import hash_file

tmp, url = Path(sys.argv[1]), sys.argv[2] or None
src = tmp / "model_ctx_qnn.bin"
remote = (lambda: RemoteStore(url, timeout=30)) if url else (lambda: None)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
record = Cache(LocalStore(tmp / "first"), remote()).store("b" * 64, {"bin": src}, b"log", {})
# a second machine: an empty local cache, so the blob comes from the first store (or the server)
second = Cache(LocalStore(tmp / ("second" if url else "first")), remote())
hit = second.lookup("b" * 64)
ok = hit is not None and second.restore(hit, {"bin": tmp / "out" / src.name})
growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(json.dumps({"ok": ok, "same": hash_file(src) == hash_file(tmp / "out" / src.name), "growth": growth,
                  "warnings": second.warnings}))
"""


def _round_trip(tmp_path: Path, url: str = "") -> dict:
    with open(tmp_path / "model_ctx_qnn.bin", "wb") as f:
        for _ in range(SIZE >> 24):
            f.write(os.urandom(1 << 24))
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), url], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def test_local_store_and_restore_stream(tmp_path: Path) -> None:
    r = _round_trip(tmp_path)
    assert r["ok"] and r["same"], r
    assert r["growth"] < 32 << 20, f"RSS grew {r['growth'] >> 20} MB for a {SIZE >> 20} MB blob"


def test_remote_upload_and_download_stream(tmp_path: Path, nginx_cache) -> None:
    r = _round_trip(tmp_path, nginx_cache.url)
    assert r["ok"] and r["same"] and r["warnings"] == [], r
    assert r["growth"] < 32 << 20, f"RSS grew {r['growth'] >> 20} MB for a {SIZE >> 20} MB blob"
