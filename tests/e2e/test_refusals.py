"""Bad inputs are one-line refusals, never a silent pass or a traceback (issue 46): `check` judges binary paths as the
EP does and never leaves OUT, a dangling `_defaults.yaml`, sample entries that are not files, ambiguous node names,
bad CTXBUILD_* values (refused at start, before anything is written)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import onnx
import pytest

from ctxbuild.errors import RecipeError
from tests.conftest import keep_only

WRAPPER = "SM8650/tiny_cnn_int8/tiny_cnn_int8_ctx.onnx"
BIN = "tiny_cnn_int8_ctx_qnn.bin"


def _point_at(wrapper: Path, dest: Path, ep_cache_context: str) -> None:
    """A copy of `wrapper` at `dest` whose EPContext node names `ep_cache_context`."""
    m = onnx.load(str(wrapper))
    for node in m.graph.node:
        for a in node.attribute:
            if a.name == "ep_cache_context":
                a.s = ep_cache_context.encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(dest))


def _runtime() -> str:
    import onnxruntime_qnn.build_and_package_info as info

    return f"qairt={info.qnn_version}"


def _check(ctxbuild, path: Path) -> tuple[int, list[dict]]:
    r = ctxbuild("check", str(path), "--runtime", _runtime(), "--no-ep", "--json")
    assert "Traceback" not in r.text, r.text
    return r.code, json.loads(r.out)


def test_check_judges_binary_paths_as_the_ep_and_never_leaves_out(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "tiny_cnn_int8.yaml")
    out = tmp_path / "out"
    assert ctxbuild("build", str(tree), "-o", str(out), "--no-verify").code == 0
    code, [row] = _check(ctxbuild, out)
    assert code == 0 and row["verdict"] == "loads", row

    # One wrapper given: its binary named with '..' or absolutely (the EP rejects both at load: QNN-NOTES.md)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out / "SM8650", elsewhere / "SM8650")
    wrapper = elsewhere / "SM8650" / "tiny_cnn_int8" / "tiny_cnn_int8_ctx.onnx"
    for name, rel in (("up", f"../tiny_cnn_int8/{BIN}"), ("abs", str(wrapper.parent / BIN))):
        _point_at(wrapper, elsewhere / "SM8650" / name / "w_ctx.onnx", rel)
        code, rows = _check(ctxbuild, elsewhere / "SM8650" / name / "w_ctx.onnx")
        assert code == 1 and {r["verdict"] for r in rows} == {"will not load"}, rows
        assert "the QNN EP refuses it at load" in rows[0]["reason"], rows

    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())

    def with_manifest(edit) -> tuple[int, list[dict]]:
        m = json.loads(json.dumps(manifest))
        edit(next(a for a in m["artifacts"] if a["path"] == WRAPPER), m)
        manifest_path.write_text(json.dumps(m))
        return _check(ctxbuild, out)

    # OUT mode: a manifest path out of OUT is not followed (the copy elsewhere would "load")
    outside = os.path.relpath(wrapper, out)
    code, [row] = with_manifest(lambda a, m: a.update(path=outside))
    assert code == 1 and row["verdict"] == "will not load" and "leads outside" in row["reason"], row
    code, [row] = with_manifest(lambda a, m: a.update(path=str(wrapper)))
    assert code == 1 and "leads outside" in row["reason"], row
    link = out / "SM8650" / "linked_ctx.onnx"  # inside OUT by name, outside by a symbolic link
    link.symlink_to(wrapper)
    code, [row] = with_manifest(lambda a, m: a.update(path="SM8650/linked_ctx.onnx"))
    assert code == 1 and "leads outside" in row["reason"], row
    link.unlink()
    binary = out / "SM8650" / "tiny_cnn_int8" / BIN  # the binary linked to the copy outside: never opened
    kept = binary.read_bytes()
    binary.unlink()
    binary.symlink_to(wrapper.parent / BIN)
    code, [row] = with_manifest(lambda a, m: None)
    assert code == 1 and "leads outside" in row["reason"], row
    binary.unlink()
    binary.write_bytes(kept)
    # An entry without a sha256 is unverified, never "loads"; its binary's too
    code, [row] = with_manifest(lambda a, m: a.pop("sha256"))
    assert code == 1 and row["verdict"] == "unverified" and "no sha256" in row["reason"], row
    code, [row] = with_manifest(lambda a, m: next(b for b in m["artifacts"] if b["path"].endswith(BIN)).pop("sha256"))
    assert code == 1 and row["verdict"] == "unverified" and BIN in row["reason"], row
    # The wrapper inside OUT re-pointed at a binary above it (its digest made to match): the EP would refuse it
    _point_at(out / WRAPPER, out / WRAPPER, f"../tiny_cnn_int8/{BIN}")
    digest = hashlib.sha256((out / WRAPPER).read_bytes()).hexdigest()
    code, [row] = with_manifest(lambda a, m: a.update(sha256=digest))
    assert code == 1 and "the QNN EP refuses it at load" in row["reason"], row
    r = ctxbuild("check", str(out), "--runtime", _runtime(), "--no-ep")
    assert "1 will not load" in r.out, r.text


@pytest.mark.parametrize("kind", ["dangling", "loop", "directory"])
def test_a_defaults_file_that_is_no_file_is_an_error(tmp_path: Path, kind: str) -> None:
    from ctxbuild.recipes import recipe

    d = tmp_path / "recipes"
    d.mkdir()
    (d / "x.yaml").write_text("model: m.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    f = d / "_defaults.yaml"
    if kind == "dangling":
        f.symlink_to(d / "gone.yaml")
    elif kind == "loop":
        f.symlink_to(f)
    else:
        f.mkdir()
    with pytest.raises(RecipeError, match=r"_defaults\.yaml:1: _defaults\.yaml is (a symbolic link to nothing|a dir)"):
        recipe.load([d])


def test_a_dangling_defaults_file_through_the_cli(tree: Path, tmp_path: Path, ctxbuild) -> None:
    keep_only(tree, "tiny_cnn_int8.yaml")
    (tree / "_defaults.yaml").unlink()
    (tree / "_defaults.yaml").symlink_to(tmp_path / "fleet" / "_defaults.yaml")
    r = ctxbuild("build", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2 and r.err.count("\n") == 1 and "dangling or a loop" in r.err, r.text
    assert not (tmp_path / "out").exists()


def _odd_entry(odd: Path, entry: str, tmp_path: Path) -> None:
    if entry == "dangling":
        odd.symlink_to(tmp_path / "gone.npz")
    elif entry == "fifo":
        os.mkfifo(odd)
    elif entry == "device":
        odd.symlink_to("/dev/zero")
    else:
        odd.mkdir()


SAID = {"dangling": "a dangling symbolic link", "fifo": "a FIFO", "device": "a device", "directory": "a directory"}


@pytest.mark.parametrize("entry", list(SAID))
def test_a_sample_entry_that_is_no_file_is_named(tmp_path: Path, entry: str) -> None:
    """Skipped silently before (1 of 4 samples verified, "ok")."""
    from ctxbuild.errors import ActionError
    from ctxbuild.graph.samples import list_samples

    (tmp_path / "a.npz").write_bytes(b"PK\x05\x06" + bytes(18))
    _odd_entry(tmp_path / "b.npz", entry, tmp_path)
    with pytest.raises(ActionError, match=rf"r.yaml: sample {tmp_path / 'b.npz'} is {SAID[entry]} \("):
        list_samples(tmp_path, 4, "r.yaml")


def test_an_ambiguous_node_name_is_refused_listing_the_nodes() -> None:
    """A node named like another, unnamed node's first output: quantization.nodes 'a' was resolved to one silently."""
    from onnx import TensorProto, helper

    from ctxbuild.actions.quantize import pinned_nodes

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["s"], name="a"),
                           helper.make_node("Tanh", ["s"], ["y"], name="t")],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(g)
    with pytest.raises(RecipeError) as e:
        pinned_nodes(model, {"a": {"activations": "uint16"}}, "r.yaml")
    assert "r.yaml: quantization.nodes: 'a' names 2 nodes: Relu unnamed, first output 'a'; Sigmoid named 'a'" in str(e.value)
    assert pinned_nodes(model, {"t": {"activations": "uint16"}}, "r.yaml") == {"t": {"activations": "uint16"}}


@pytest.mark.parametrize("name, value, says", [
    ("CTXBUILD_REMOTE_TIMEOUT", "inf", "expected a finite number above 0"),
    ("CTXBUILD_REMOTE_TIMEOUT", "-1", "expected a finite number above 0"),
    ("CTXBUILD_REMOTE_MIN_RATE", "0", "expected a finite number above 0"),
    ("CTXBUILD_REMOTE_MAX_DOWNLOAD", "0", "1 or more"),
    ("CTXBUILD_TOOLCHAIN_OVERRIDE", "{bad", "expected a JSON object"),
    ("CTXBUILD_TOOLCHAIN_OVERRIDE", "[1]", "expected a JSON object"),
    ("CTXBUILD_VERIFY_WORKERS", "0", "1 or more"),
    ("CTXBUILD_ORT_LOG_LEVEL", "abc", "0 (verbose) to 4 (fatal)"),
    ("CTXBUILD_ORT_LOG_LEVEL", "7", "0 (verbose) to 4 (fatal)"),
    ("CTXBUILD_EXECUTOR_FALLBACK", "maybe", "expected fail or local"),
])
def test_a_bad_value_is_refused_at_start_naming_the_variable(tmp_path: Path, ctxbuild, name: str, value: str,
                                                             says: str) -> None:
    """Checked once before anything runs (issue 46): before, inf or 0 failed every action, a negative timeout blamed
    the token, {bad ended in a traceback, VERIFY_WORKERS=0 was found after compiling and abc was reported as a
    failure of the QNN SDK's probe."""
    (tmp_path / "recipes").mkdir()
    r = ctxbuild("build", "recipes", "-o", "out", env={name: value})
    assert r.code == 2, r.text
    assert r.err.startswith(f"ctxbuild: error: {name}={value!r}: ") and says in r.err and r.err.count("\n") == 1, r.err
    assert not (tmp_path / "out").exists()
