"""Remote cache credentials are never persisted (issue 19, item 9): not in OUT (plan state, build.ninja,
records, logs, manifest, report), not in the user cache (plan memo, records), not in any message. They
live in the environment (--remote-cache / $CTXBUILD_REMOTE_CACHE, a token variable) or ~/.netrc; a
defaults file (committed with the recipes) that holds them is refused."""
from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ctxbuild.cache import RemoteStore
from tests.conftest import keep_only

SECRET = "s3cretPa55"


def _leaks(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file() and not p.is_symlink() and SECRET.encode() in p.read_bytes():
                found.append(str(p))
    return found


def test_credentials_in_a_defaults_file_are_refused(tree: Path, tmp_path: Path, ctxbuild, cache_dir: Path) -> None:
    keep_only(tree, "mlp_fp16.yaml")
    defaults = tree / "_defaults.yaml"
    defaults.write_text(defaults.read_text() + f"cache:\n  remote: http://ci:{SECRET}@127.0.0.1:9/cache\n")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"), "--no-verify")
    assert r.code == 2, r.text
    line = r.err.strip().splitlines()[-1]
    assert "_defaults.yaml:" in line and "cache.remote" in line and "netrc" in line and "token_env" in line, line
    assert SECRET not in r.text
    assert _leaks(tmp_path / "out", cache_dir) == [] if (tmp_path / "out").exists() else True
    assert not cache_dir.exists() or _leaks(cache_dir) == []


def test_credentials_on_the_command_line_are_never_written(tree: Path, tmp_path: Path, ctxbuild,
                                                          cache_dir: Path) -> None:
    """A dead server on loopback: the build goes on without it, and nothing it wrote holds the password."""
    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    url = f"http://ci:{SECRET}@127.0.0.1:9/cache"
    r = ctxbuild("build", str(tree), "-o", str(out), "--no-verify", "--remote-cache", url)
    assert r.code == 0, r.text
    assert "remote cache http://127.0.0.1:9/cache" in r.text  # the one warning, without the credentials
    r2 = ctxbuild("build", str(tree), "-o", str(tmp_path / "out2"), "--no-verify", env={"CTXBUILD_REMOTE_CACHE": url})
    assert r2.code == 0, r2.text
    assert SECRET not in r.text + r2.text
    assert (out / "report.json").is_file() and (cache_dir / "memo" / "plans").is_dir()
    assert _leaks(out, tmp_path / "out2", cache_dir) == []


def test_netrc_supplies_basic_auth(tmp_path: Path, monkeypatch) -> None:
    """With no credentials in the URL and no token, ~/.netrc ($NETRC) names the login, as curl and pip do."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        netrc = tmp_path / "netrc"
        netrc.write_text(f"machine 127.0.0.1 login ci password {SECRET}\n")
        netrc.chmod(0o600)
        monkeypatch.setenv("NETRC", str(netrc))
        store = RemoteStore(f"http://127.0.0.1:{server.server_address[1]}", timeout=5)
        assert not store.has_blob("0" * 64)
        assert seen == ["Basic " + base64.b64encode(f"ci:{SECRET}".encode()).decode()]
        assert SECRET not in repr(store) and SECRET not in store.url
    finally:
        server.shutdown()
        server.server_close()


def test_farm_requests_carry_no_credentials() -> None:
    """The store description rides in every Dask request (and the scheduler's logs): the URL goes stripped;
    a worker authenticates with its own ~/.netrc or token variable."""
    from ctxbuild.engine.farm.gateway import check_data_plane

    store = check_data_plane({"CTXBUILD_REMOTE_CACHE": f"http://ci:{SECRET}@127.0.0.1:9/c"})
    assert store["url"] == "http://127.0.0.1:9/c" and SECRET not in repr(store)
