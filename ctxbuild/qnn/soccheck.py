"""The SoC a context binary says it was built for (libQnnSystem, as `inspect` reads it) against the target.

Run after every compile, bundle and prebuilt wrap (before the outputs are placed) and after every cache
restore: provider options, a QNN quirk or a poisoned remote record cannot ship another SoC's binary
under this target's name. libQnnSystem reads the bytes in a forked child (35-75 ms measured on a busy
2-core machine; `inspect`'s fresh interpreter took ~0.4 s): a binary that crashes or hangs it fails this
action with one line, nothing else. What it read is memoized in the user cache by the file's sha256 and
the installed QNN: a restore of a binary this machine has read before costs a hash, not a read (restoring
the examples: 16 reads and importing onnx, ~0.3 s of ~0.6 s). The deploy gate reads its facts the same way.
"""
from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from ctxbuild.toolchain import installed as toolchain
from ctxbuild.atomic import write_bytes
from ctxbuild.errors import ActionError, InspectError
from ctxbuild.layout import memo_dir

TIMEOUT_S = 60


_FORK_LOCK = threading.Lock()  # prerestore checks from threads: one fork at a time


def check_outputs(action: Any, outputs: dict[str, Path], *, exact: bool = True) -> None:
    """The binary holds exactly the SoCs asked for; with `exact=False` (a prebuilt binary), at least them."""
    try:
        have = _targets(outputs)
    except (InspectError, OSError) as e:
        raise ActionError(f"cannot read the context binary back: {e}") from None
    # What was asked of QNN (a multi-SoC recipe's verification twin is compiled for its first SoC only).
    asked = action.params.get("provider_options") or action.params
    want = set(zip(asked["soc_model"].split(","), asked["htp_arch"].split(",")))
    if have and (have != want if exact else not want <= have):
        shown = ", ".join(f"soc_model {s} / HTP v{a}" for s, a in sorted(have))
        wanted = ", ".join(f"soc_model {s} / HTP v{a}" for s, a in sorted(want))
        raise ActionError(f"the binary is built for {shown}, but {action.target['name']} asked for {wanted}",
                          "check compile.provider_options; rebuild without the cache if it persists")


def _targets(outputs: dict[str, Path]) -> set[tuple[str, str]]:
    """(soc_model, htp_arch) of every target the binary holds, from the memo or read in a child."""
    source = outputs["bin"] if "bin" in outputs else outputs[min(r for r in outputs if r.startswith("ctx"))]
    facts = binary_facts(source, embedded="bin" not in outputs)
    return {(str(s), str(a)) for s, a in facts["targets"]}


def binary_facts(source: Path, *, embedded: bool) -> dict[str, Any]:
    """What a context binary's own header says (as `inspect` reads it): {"targets": [[soc_model, htp_arch]],
    "build_id", "backend_id", "backend_api_version", "vtcm_mb" (its graphs' largest, None if unsaid)}; `embedded`: `source` is a wrapper holding it. Memoized in the
    user cache by the bytes' sha256 and the installed QNN. InspectError if libQnnSystem cannot read it."""
    data = _binary_bytes(source, embedded=True) if embedded else None  # a .bin is hashed streaming: GBs for an LLM
    if data is None:
        with open(source, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    else:
        digest = hashlib.sha256(data).hexdigest()
    memo = memo_dir("binary-facts") / f"{digest}-{_qnn_id()}.json"
    try:
        return json.loads(memo.read_bytes())
    except (OSError, ValueError):
        pass
    with _FORK_LOCK:
        info = _read_in_child(data if data is not None else source.read_bytes())
    facts = {"targets": sorted([t["soc_model"], t["htp_arch"]] for t in info.get("targets") or []
                               if t.get("soc_model") is not None and t.get("htp_arch") is not None),
             "build_id": info.get("build_id"), "backend_id": info.get("backend_id"),
             "backend_api_version": info.get("backend_api_version"), "vtcm_mb": _vtcm_mb(info)}
    try:
        write_bytes(memo, json.dumps(facts).encode(), durable=False)
    except OSError:  # a read-only cache dir: read every time
        pass
    return facts


def _vtcm_mb(info: dict[str, Any]) -> int | None:
    sizes = [(g.get("graph_blob") or {}).get("vtcm_bytes") for g in info.get("graphs") or []]
    return max((s for s in sizes if s), default=0) >> 20 or None


@lru_cache(maxsize=1)
def _qnn_id() -> str:
    """Names the installed QNN (its wheels' versions, its libraries' stats) without the SDK id's probe compile,
    which a read-only cache dir would make every action pay."""
    return hashlib.sha256(json.dumps(toolchain.quick_stamp()).encode()).hexdigest()[:16]


def _binary_bytes(source: Path, *, embedded: bool) -> bytes:
    """The .bin, or the context embedded in the (first) EPContext wrapper."""
    if not embedded:
        return source.read_bytes()
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "EPContext" and a.name == "ep_cache_context":
                return a.s
    raise InspectError(f"{source}: no EPContext node with an embedded context")


def _read_in_child(data: bytes) -> dict[str, Any]:
    from ctxbuild.qnn.system import binary_info_from_bytes

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
