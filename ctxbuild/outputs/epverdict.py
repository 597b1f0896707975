"""The EP's own verdict beside the gate's (`ctxbuild check`): onnxruntime's GetModelCompatibilityForEpDevices
(C API; Python: onnxruntime.capi.onnxruntime_pybind11_state.get_model_compatibility_for_ep_devices) asked, in
the runtime's own toolchain, about each wrapper's compatibility string.

Only where that toolchain is here already (the installed one, or provisioned: `check` downloads nothing). The EP
answers only with a session of its own alive, and judges the settings of the session rather than the machine's
device, so the session is made for the row's SoC (its htp_arch and soc_model). Measured (docs/deploy.md): on
this x86 simulator only onnxruntime-qnn 2.3.0 and 2.4.0 answer; 2.5.0+ say EP_NOT_APPLICABLE ("n/a" here). The
gate's verdict stays the one that decides: it reads the binary, the EP reads the wrapper's string, which
2.3.0-2.6.0 write with another arch than they compiled for.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from ctxbuild.errors import cause_line
from ctxbuild.recipes import targets as soc_table
from ctxbuild.toolchain import provision
from ctxbuild.toolchain.choose import choose
from ctxbuild.toolchain.installed import version
from ctxbuild.toolchain.runtimes import Runtime, fmt

SAYS = {"EP_SUPPORTED_OPTIMAL": "loads", "EP_SUPPORTED_PREFER_RECOMPILATION": "loads, not optimal",
        "EP_UNSUPPORTED": "will not load", "EP_NOT_APPLICABLE": "n/a"}

# stdin: [[info, htp_arch, soc_model], ...]; stdout: the EP's answer per ask, in order. A session per SoC stays
# alive while its asks are answered (a tiny Relu compiled for that SoC).
_ASK = r"""
import json, sys, tempfile, onnx, onnxruntime as ort, onnxruntime_qnn
from onnx import helper, TensorProto
import onnxruntime.capi.onnxruntime_pybind11_state as C
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
asks = json.load(sys.stdin)
d = tempfile.mkdtemp()
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), f"{d}/m.onnx")
answers = [None] * len(asks)
for arch, soc in sorted({(a[1], a[2]) for a in asks}):
    so = ort.SessionOptions()
    so.add_provider_for_devices(devices, {"backend_type": "htp", "htp_arch": str(arch), "soc_model": str(soc),
                                          "enable_htp_fp16_precision": "1"})
    ort.ModelCompiler(so, f"{d}/m.onnx").compile_to_file(f"{d}/m_{arch}_{soc}.onnx")
    alive = ort.InferenceSession(f"{d}/m_{arch}_{soc}.onnx", so)
    for i, (info, a, s) in enumerate(asks):
        if (a, s) == (arch, soc):
            answers[i] = str(C.get_model_compatibility_for_ep_devices(devices, info)).split(".")[-1]
    del alive
print(json.dumps(answers))
"""


def add_ep_verdicts(rows: list[dict[str, Any]], runtimes: list[Runtime]) -> None:
    """Set each row's `ep_verdict` ("loads", "loads, not optimal", "will not load", "n/a": the EP does not
    answer here) and `ep_runtime`, or `ep_verdict` None with `ep_why` when it cannot be asked."""
    installed = version("onnxruntime-qnn")
    for rt in runtimes:
        mine = [r for r in rows if r["runtime"] == rt.label]
        tc = choose({"onnxruntime-qnn": rt.plugin} if rt.plugin else {"qairt": fmt(rt.qairt)}, "--runtime", installed)
        if tc is not None and provision.provisioned(tc) is None:
            for r in mine:
                r.update(ep_verdict=None, ep_why=f"toolchain {tc.plugin} is not provisioned here "
                                                 f"(`ctxbuild toolchain provision {tc.plugin}`)")
            continue
        asks, where = [], []
        for r in mine:
            soc = soc_table.lookup(r["soc"])
            if r.get("ep_compatibility_info") and soc is not None and soc.htp_arch is not None:
                asks.append([r["ep_compatibility_info"], soc.htp_arch, soc.soc_model])
                where.append(r)
            else:
                r.update(ep_verdict=None, ep_why="the wrapper has no compatibility string for the EP, or the SoC "
                                                 "is not in the SoC table")
        if not asks:
            continue
        p = subprocess.run([sys.executable, "-c", _ASK], input=json.dumps(asks), capture_output=True, text=True,
                           env=provision.env_for(tc), timeout=600)
        answers = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else None
        for r, said in zip(where, answers or [None] * len(where)):
            r.update(ep_verdict=SAYS.get(said, said), ep_runtime=tc.plugin if tc else installed)
            if said is None:
                r["ep_why"] = f"asking the EP failed: {cause_line(p.stderr, last=True)}"
