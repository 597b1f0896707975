"""Load and run EPContext models with the real QNN EP (HTP simulator on x86)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from ctxbuild import toolchain


def qnn_session(ctx_model: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(toolchain.qnn_devices(), {"backend_type": "htp"})
    return ort.InferenceSession(str(ctx_model), so)


def cpu_run(model: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
