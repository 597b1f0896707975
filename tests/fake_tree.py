"""The example recipes over placeholder model files: enough for the planner and the renderer, which never
read a model (fast unit tests, no onnxruntime, no QNN)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.conftest import RECIPES


def fake_tree(dst: Path) -> Path:
    """A copy of recipes/*.yaml under `dst`, every model or adapter it names a small distinct file, every other
    models/ path an empty directory (calibration sets: found at run time, never at plan time)."""
    dst.mkdir(parents=True)
    for src in sorted(RECIPES.glob("*.yaml")):
        shutil.copy(src, dst / src.name)
        for ref in re.findall(r"models/[\w/.\-]+", src.read_text()):
            path = dst / ref
            if path.suffix in (".onnx", ".safetensors", ".npz", ".onnx_adapter"):  # models, LoRA adapters
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(f"placeholder for {ref}".encode())
            else:
                path.mkdir(parents=True, exist_ok=True)
    return dst
