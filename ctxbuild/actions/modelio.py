"""Reading ONNX models with errors that name the file, and describing their graph inputs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ActionError


def load(path: Path, *, external_data: bool = True) -> Any:
    import onnx
    from google.protobuf.message import DecodeError

    if not path.is_file():
        raise ActionError(f"{path}: model file not found")
    try:
        return onnx.load(str(path), load_external_data=external_data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise ActionError(f"{path}: not a valid ONNX model ({str(e).splitlines()[0][:120] or type(e).__name__})",
                          "re-export the model; the file may be truncated or not ONNX") from None
    except FileNotFoundError as e:
        raise ActionError(f"{path}: external data file missing: {e.filename}",
                          "keep the model's .data files next to it") from None


def graph_inputs(model: Any) -> list[Any]:
    """Real inputs: graph inputs that are not initializers (older exporters list weights as inputs)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def external_data_files(model: Any, model_path: Path) -> dict[str, Path]:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    files: dict[str, Path] = {}
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc:
                files[f"external:{loc}"] = _checked_location(model_path, t.name, loc)
    return files


def _checked_location(model_path: Path, tensor: str, loc: str) -> Path:
    """Before anything reads it: inside the model's directory (no absolute path, no '..' out, no symlink
    out) and a regular file (not /dev/zero, a fifo or a directory)."""
    import stat

    base = model_path.resolve().parent
    path = (base / loc).resolve()
    where = f"{model_path}: tensor '{tensor}': external data location '{loc}'"
    if Path(loc).is_absolute() or not path.is_relative_to(base):
        raise ActionError(f"{where} is outside the model's directory",
                          "keep external data files beside the model (onnx refuses other locations too)")
    try:
        mode = path.stat().st_mode
    except OSError:
        raise ActionError(f"{where}: file not found ({path})", "keep the model's .data files next to it") from None
    if not stat.S_ISREG(mode):
        raise ActionError(f"{where} is not a regular file", "point it at the model's .data file")
    return path
