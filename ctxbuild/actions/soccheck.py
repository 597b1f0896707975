"""The SoC a context binary says it was built for (libQnnSystem, as `inspect` reads it) against the target.

Run after every compile, bundle and prebuilt wrap (before the outputs are placed) and after every cache
restore: provider options, a QNN quirk or a poisoned remote record cannot ship another SoC's binary
under this target's name. libQnnSystem reads the bytes in a forked child (35-75 ms measured on a busy
2-core machine; `inspect`'s fresh interpreter took ~0.4 s): a binary that crashes or hangs it fails this
action with one line, nothing else.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time
from pathlib import Path
from typing import Any

from ..errors import ActionError, InspectError

TIMEOUT_S = 60


def check_outputs(action: Any, outputs: dict[str, Path]) -> None:
    try:
        info = _read_in_child(_binary_bytes(outputs))
    except (InspectError, OSError) as e:
        raise ActionError(f"cannot read the context binary back: {e}") from None
    # What was asked of QNN (a multi-SoC recipe's verification twin is compiled for its first SoC only).
    asked = action.params.get("provider_options") or action.params
    want = set(zip(asked["soc_model"].split(","), asked["htp_arch"].split(",")))
    have = {(str(t["soc_model"]), str(t["htp_arch"])) for t in info.get("targets") or []
            if t.get("soc_model") is not None and t.get("htp_arch") is not None}
    if have and have != want:
        shown = ", ".join(f"soc_model {s} / HTP v{a}" for s, a in sorted(have))
        wanted = ", ".join(f"soc_model {s} / HTP v{a}" for s, a in sorted(want))
        raise ActionError(f"the binary is built for {shown}, but {action.target['name']} asked for {wanted}",
                          "check compile.provider_options; rebuild without the cache if it persists")


def _binary_bytes(outputs: dict[str, Path]) -> bytes:
    """The .bin, or the context embedded in the (first) EPContext wrapper."""
    if "bin" in outputs:
        return outputs["bin"].read_bytes()
    import onnx

    ctx = outputs[min(r for r in outputs if r.startswith("ctx"))]
    model = onnx.load(str(ctx), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "EPContext" and a.name == "ep_cache_context":
                return a.s
    raise InspectError(f"{ctx}: no EPContext node with an embedded context")


def _read_in_child(data: bytes) -> dict[str, Any]:
    from ..qnn_system import binary_info_from_bytes

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 0
        try:
            os.close(r)
            try:
                result: dict[str, Any] = binary_info_from_bytes(data, "context binary")
            except InspectError as e:
                result = {"error": str(e)}
            with os.fdopen(w, "wb") as f:
                f.write(json.dumps(result, default=str).encode())
        except BaseException:  # noqa: BLE001 - a child must not run the parent's cleanup
            code = 1
        os._exit(code)
    os.close(w)
    out, deadline = b"", time.monotonic() + TIMEOUT_S
    with os.fdopen(r, "rb", buffering=0) as f:
        while select.select([f], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = f.read(1 << 16)
            if not chunk:
                break
            out += chunk
        else:
            os.kill(pid, signal.SIGKILL)  # a hang in libQnnSystem
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise InspectError(f"libQnnSystem crashed ({signal.Signals(os.WTERMSIG(status)).name}) reading it")
    try:
        result = json.loads(out)
    except ValueError:
        raise InspectError("libQnnSystem gave no answer") from None
    if "error" in result:
        raise InspectError(result["error"])
    return result
