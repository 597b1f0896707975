"""A model whose output size depends on its input: verification says so and names the way out (split the
model), instead of a raw numpy error (issue 18 item 3)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from ctxbuild.errors import ActionError
from ctxbuild.verify.measure import compare
from tests._qnn_models import nonzero_model


def test_compiled_output_of_another_size() -> None:
    with pytest.raises(ActionError) as e:
        compare({"y": np.zeros((2, 5))}, {"y": np.zeros((2, 8))})
    assert str(e.value).startswith("output 'y': the output shape [2, 8] differs from the float model's [2, 5] (")
    assert "split the model" in str(e.value)


def test_float_output_size_follows_the_data(tmp_path: Path, ctxbuild) -> None:
    """NonZero on the CPU (cpu_fallback): 2 and 5 positives give outputs [2, 2] and [2, 5]."""
    onnx.save(nonzero_model(), tmp_path / "nz.onnx")
    (tmp_path / "s").mkdir()
    for i, k in enumerate((2, 5)):
        x = -np.ones((1, 8), np.float32)
        x[0, :k] = 1
        np.save(tmp_path / "s" / f"s{i}.npy", x)
    (tmp_path / "nz.yaml").write_text("model: nz.onnx\nprecision: fp16\ntargets: [SM8650]\n"
                                      "compile: {cpu_fallback: true}\nverify: {dir: s}\n")
    r = ctxbuild("build", str(tmp_path / "nz.yaml"), "-o", str(tmp_path / "out"))
    assert r.code == 1 and "Error" not in r.text and "Traceback" not in r.text, r.text
    (line,) = [ln for ln in r.err.splitlines() if ln.startswith("ctxbuild: FAILED verify/nz@SM8650")]
    assert "output 'y' of the float model changes shape with the input ([2, 2], [2, 5] over 2 samples)" in line
    assert ("split the model: build the static part alone with `outputs: [r]` in the recipe (the rest, from NonZero "
            "'find_nonzero' on, runs in the app)") in line, line
