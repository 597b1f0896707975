"""A model's graph inputs (names and shapes) and whether it is already statically quantized, for plan-time
checks: read without external data, memoized in the user cache by the file's stat (a re-plan does not parse
the same model twice)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from ctxbuild.atomic import write_bytes
from ctxbuild.layout import cache_dir

# dims taken in this order fit the other shape: (their layout, the other's)
LAYOUTS = {(0, 3, 1, 2): ("NHWC", "NCHW"), (0, 2, 3, 1): ("NCHW", "NHWC")}

Dim = int | str | None  # a fixed size, a named dynamic dim, or an unnamed one
MEMO = "memo/graph-signature"  # {"inputs": name -> shape, "quantize_linear": [node names]}


def graph_input_shapes(model: Path) -> dict[str, list[Dim]] | None:
    """name -> shape for each real graph input (initializers excluded); None if the file does not parse as
    ONNX (the prepare action reports that, with its own message)."""
    found = _signature(model)
    return None if found is None else found["inputs"]


def quantize_nodes(model: Path) -> list[str]:
    """Names of the model's QuantizeLinear nodes: activations quantized statically (a QDQ export); [] for a
    float model, a weight-only int8 one or a dynamic-int8 one (prepare turns those into float)."""
    found = _signature(model)
    return [] if found is None else found["quantize_linear"]


def _signature(model: Path) -> dict | None:
    return memoized_by_stat(model, MEMO, lambda: _read(model))


def memoized_by_stat(model: Path, memo_name: str, compute: Callable[[], Any]) -> Any:
    """compute() (JSON-able), memoized in the user cache under `memo_name` by the file's stat; None is not kept."""
    st = model.stat()
    stamp = [str(model.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
    memo = cache_dir() / memo_name / f"{hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32]}.json"
    try:
        return json.loads(memo.read_text())
    except (OSError, ValueError):
        pass
    value = compute()
    if value is not None:
        try:
            write_bytes(memo, json.dumps(value).encode(), durable=False)
        except OSError:  # a read-only cache: no memo, same answer
            pass
    return value


def _read(model: Path) -> dict | None:
    import onnx
    from google.protobuf.message import DecodeError

    from ctxbuild.graph.modelio import graph_inputs

    try:
        m = onnx.load(os.fspath(model), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError):
        return None
    shapes: dict[str, list[Dim]] = {}
    for i in graph_inputs(m):
        dims = i.type.tensor_type.shape.dim
        shapes[i.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                          else (d.dim_param or None) for d in dims]
    quantize = [n.name or f"#{k}" for k, n in enumerate(m.graph.node) if n.op_type == "QuantizeLinear"]
    return {"inputs": shapes, "quantize_linear": quantize}
