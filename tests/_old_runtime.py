"""An older device runtime for the tests: onnxruntime 1.24.4 + onnxruntime-qnn 2.3.0 (QAIRT 2.47) in its own
virtualenv, driven by subprocess. $CTXBUILD_TEST_OLD_RUNTIME names its python; else one provisioned once under
the user cache (pip, exact pins, ~25 s and ~540 MB), reused after. No network and no such env: the test skips."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PINS = ["onnxruntime==1.24.4", "onnxruntime-qnn==2.3.0", "numpy==2.4.6", "onnx==1.23.2", "protobuf==7.36.2"]
QAIRT = "2.47"

# Opens `argv[1]` on the QNN EP (no CPU fallback), runs it once on ones (the simulator), and prints one JSON
# line: {"ok": bool, "error": str, "outputs": [sum of each output]}.
LOAD_SCRIPT = """
import json, sys
import numpy as np
import onnxruntime as ort, onnxruntime_qnn
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
so = ort.SessionOptions()
so.log_severity_level = 4
so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
so.add_provider_for_devices(devices, {"backend_type": "htp"})
try:
    sess = ort.InferenceSession(sys.argv[1], so)
    feeds = {i.name: np.ones(i.shape, np.float32) for i in sess.get_inputs()}
    outputs = [float(np.asarray(o, np.float64).sum()) for o in sess.run(None, feeds)]
    print(json.dumps({"ok": True, "error": "", "outputs": outputs}))
except Exception as e:
    print(json.dumps({"ok": False, "error": str(e)}))
"""


def old_runtime_python() -> Path:
    if env := os.environ.get("CTXBUILD_TEST_OLD_RUNTIME"):
        return Path(env)
    venv = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ctxbuild" / "test-runtimes" / "ort-qnn-2.3.0"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PINS], check=True, capture_output=True,
                           timeout=900)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot provision onnxruntime-qnn 2.3.0 (offline?): {getattr(e, 'stderr', b'')[-300:]!r}")
        (venv / ".complete").touch()
    return python


def load(python: Path, wrapper: Path) -> dict[str, object]:
    """Create an InferenceSession for `wrapper` in that runtime and run it once: {"ok", "error", "outputs"}."""
    r = subprocess.run([str(python), "-c", LOAD_SCRIPT, str(wrapper)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
