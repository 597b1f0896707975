"""How the CLI ends (issue 33): one JSON document on every exit under --json, a `clean` that can run twice, a
dry run that writes nothing, and no process of the build left behind after a Ctrl-C."""
from __future__ import annotations

from pathlib import Path

from tests.conftest import keep_only


def test_second_clean_has_nothing_to_clean(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """As a second `make clean`: exit 0, saying so; what ctxbuild did not write stays, as after the first."""
    keep_only(tree, "mlp_fp16.yaml")
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650", "--no-verify")
    assert r.code == 0, r.text
    (out / "notes.txt").write_text("mine")
    r = ctxbuild("clean", "-o", str(out))
    assert r.code == 0 and r.out == "", r.text
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    for _ in range(2):
        r = ctxbuild("clean", "-o", str(out))
        assert r.code == 0, r.text
        assert r.out == f"ctxbuild: nothing to clean in {out} (no ctxbuild output there)\n", r.text
        assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (out / "notes.txt").unlink()
    out.rmdir()
    r = ctxbuild("clean", "-o", str(out))
    assert r.code == 0 and "nothing to clean" in r.out, r.text
    assert ctxbuild("clean", "-q", "-o", str(out)).text == ""
