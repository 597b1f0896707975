"""dilated_conv: a 1-D Conv of large dilation that QNN refuses quantized (finalize: QNN_COMMON_ERROR_MEM_ALLOC), as
an EEG spindle detector's temporal convs are (brainmaze-eeg-models, dilations to 4096), folded into rows."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ctxbuild.graph.legalize import legalize, wanted
from tests._qnn_models import TARGET, cosine, qnn_session
from tests.e2e.test_legalize import _int16, _model, _run, rng


def _dilated(d: int, channels: int, length: int, pads: list[int]) -> onnx.ModelProto:
    w = (rng().standard_normal((channels, channels, 3)) / np.sqrt(3 * channels)).astype(np.float32)
    b = rng().standard_normal(channels).astype(np.float32)
    out = length + sum(pads) - 2 * d
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], dilations=[d], pads=pads)],
                  {"x": [1, channels, length]}, {"y": [1, channels, out]}, {"w": w, "b": b})


def _legalized(m: onnx.ModelProto) -> onnx.ModelProto:
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(m)
    assert legalize(rewritten).rewrites == {"dilated_conv": 1}
    onnx.checker.check_model(rewritten, full_check=True)
    return rewritten


def test_dilated_conv_refused_quantized_compiles_folded(tmp_path: Path) -> None:
    """64 channels x dilation 4096 over 15692 samples (the detector's last conv, padded as it pads): the int16 model
    is refused; folded into rows of 4096 it compiles and the simulator matches the float model."""
    m = _dilated(4096, 64, 7500 + 2 * 4096, [0, 0])
    rewritten = _legalized(m)
    samples = [{"x": rng().standard_normal((1, 64, 15692)).astype(np.float32) * s} for s in (1.0, 0.5, 2.0)]
    for feeds in samples:
        (a,), (b,) = _run(m, feeds), _run(rewritten, feeds)
        assert a.shape == b.shape == (1, 64, 7500) and np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    assert _int16(m, samples, tmp_path, "original") is None  # measured: refused, MEM_ALLOC at finalize
    ctx = _int16(rewritten, samples, tmp_path, "rewritten")
    assert ctx is not None
    (got,) = qnn_session(ctx, **TARGET).run(None, samples[0])
    assert cosine(_run(m, samples[0])[0], got) > 0.999


def test_dilated_conv_pads_and_a_ragged_last_row() -> None:
    """Explicit pads (PyTorch's padding=d) and an output length that is not a whole number of rows: the same values
    on the CPU EP; a small dilation x channels is left as written (QNN compiles it)."""
    m = _dilated(1000, 128, 3001, [1000, 1000])
    rewritten = _legalized(m)
    assert {n.op_type for n in rewritten.graph.node} >= {"Pad", "Reshape", "Slice"}
    feeds = {"x": rng().standard_normal((1, 128, 3001)).astype(np.float32)}
    (a,), (b,) = _run(m, feeds), _run(rewritten, feeds)
    assert a.shape == b.shape == (1, 128, 3001) and np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    small = _dilated(16, 128, 600, [0, 0])
    assert not wanted(small, ["dilated_conv"]) and legalize(small).rewrites == {}  # prepare skips its sample check
