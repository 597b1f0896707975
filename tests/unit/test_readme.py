"""The README's commands, run: the quick start on a generated model (its recipe block verbatim, its build
command, the files it promises), its "load and run it" block on what that built (and the log lines the README says
it silences and prints), the Makefile snippet, `ctxbuild --version`; the developer commands (`make build`,
`make test`, the install lines) as far as a test can without recursing into the suite."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)


def _block(lang: str, containing: str) -> str:
    [body] = [b for lang_, b in BLOCKS if lang_ == lang and containing in b]
    return body


def _detector(path: Path) -> None:
    """The README's `models/detector.onnx`: one input `image` [N, 3, 320, 320] (the batch dim dynamic)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(8, np.float32), "b")
    nodes = [helper.make_node("Conv", ["image", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[4, 4]),
             helper.make_node("Relu", ["c"], ["boxes"], name="relu")]
    g = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 320, 320])],
                          [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 8, 80, 80])], [w, b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def _shell(cmd: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "CTXBUILD_CACHE_DIR": str(cache)}
    env.pop("MAKEFLAGS", None)
    return subprocess.run(["bash", "-ec", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_quick_start_and_makefile_snippet(tmp_path: Path) -> None:
    (tmp_path / "models" / "calib").mkdir(parents=True)
    (tmp_path / "recipes").mkdir()
    _detector(tmp_path / "models" / "detector.onnx")
    rng = np.random.default_rng(1)
    for i in range(3):  # "a few representative inputs saved as .npy files in models/calib/"
        np.save(tmp_path / "models" / "calib" / f"{i}.npy", rng.random((1, 3, 320, 320), np.float32))
    recipe = _block("yaml", "name: detector")
    assert recipe.startswith("# recipes/detector.yaml\n")
    (tmp_path / "recipes" / "detector.yaml").write_text(recipe)

    [build] = [b.strip() for lang, b in BLOCKS if not lang and b.strip().startswith("ctxbuild build")]
    r = _shell(build, tmp_path, tmp_path / "cache")
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    for soc in ("SM8650", "SM8750"):  # what the README says a build gives, per target
        for f in ("detector_ctx.onnx", "detector_ctx_qnn.bin", "detector_verify.json"):
            assert (out / soc / "detector" / f).is_file(), f
    assert (out / "manifest.json").is_file() and (out / "report.html").is_file()
    assert r.stdout.splitlines()[-1] == f"ctxbuild: report: {out / 'report.html'}"  # "ends with an answer"
    r = _shell(build, tmp_path, tmp_path / "cache")  # "A second `ctxbuild build` does nothing"
    assert "ctxbuild: up to date" in r.stdout and "ninja" not in r.stdout + r.stderr

    snippet = _block("make", "ctxbuild build")
    (tmp_path / "Makefile").write_text(snippet)
    target = snippet.split(":", 1)[0].strip()
    r = _shell(f"make {target}", tmp_path, tmp_path / "cache")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "out" / "npu" / "SM8650" / "detector" / "detector_ctx.onnx").is_file()

    r = _shell("ctxbuild --version", tmp_path, tmp_path / "cache")  # the install block's check
    assert r.returncode == 0 and r.stdout.startswith("ctxbuild ")


def test_developer_commands_exist() -> None:
    """`make build`, `make test`, `make test-full` and `make unit` name real targets (a dry run: running the suite from the suite would
    recurse); the install block installs from the clone (`pip install .`), which .ci/wheel-check runs."""
    dev = _block("", "make build")
    targets = re.findall(r"^make ([\w-]+)", dev, re.M)
    assert targets == ["build", "test", "test-full", "unit"]
    r = subprocess.run(["make", "-n", *targets], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    install = _block("", "pip install")
    assert "pip install ." in install and "ctxbuild --version" in install
    assert "pip wheel" in (ROOT / ".ci" / "wheel-check").read_text()


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXBUILD_")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _load_and_run(tree: Path) -> None:
    """The "Load and run it" block as written, in the quick start's directory after its build: it runs the built
    binary on the simulator, and its output is the float model's; onnxruntime logs nothing (its two warnings are
    silenced), and without the silencing line it logs exactly the two the README quotes, the simulator's own line
    aside on stdout."""
    block = _block("python", "InferenceSession")
    assert len(block.strip().splitlines()) == 5
    r = _python(block + "np.save('boxes.npy', boxes)\n", tree)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[W:onnxruntime" not in r.stderr and "[E:onnxruntime" not in r.stderr, r.stderr
    sample = np.load(tree / "models" / "calib" / "0.npy")
    import onnxruntime as ort

    (ref,) = ort.InferenceSession(str(tree / "models" / "detector.onnx"),
                                  providers=["CPUExecutionProvider"]).run(None, {"image": sample})
    got = np.load(tree / "boxes.npy").ravel().astype(np.float64)
    assert got @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref)) > 0.999

    said = README[README.index(block):].split("\n## ")[0]
    quoted = [" ".join(q.split()) for q in re.findall(r"`([^`]+) \.\.\.`", said)]  # each line up to "..."
    assert len(quoted) == 3, quoted
    [silenced] = [line for line in block.splitlines() if "log_severity_level" in line]
    r = _python(block.replace(silenced, silenced.split(";")[0]), tree)  # the SessionOptions without the setting
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [line for line in r.stderr.splitlines() if "[W:onnxruntime" in line]
    assert len(warnings) == 2 and len(r.stderr.strip().splitlines()) == 2, r.stderr
    for warning, quote in zip(warnings, quoted[:2]):
        assert quote in warning, (quote, warning)
    printed = [line for line in r.stdout.splitlines() if line.strip()]
    assert printed and all(quoted[2] in line for line in printed), r.stdout  # the simulator's line, nothing else
