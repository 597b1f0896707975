"""qnn/compat.py (the QNN EP's compatibility info and rules), toolchain/runtimes.py (device runtimes) and
graph/protowire.py (reading a wrapper without onnx): unit tests on the strings real toolchains wrote."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ctxbuild.errors import UsageError
from ctxbuild.graph.protowire import wrapper_facts
from ctxbuild.outputs import gate
from ctxbuild.qnn.compat import Compatibility, Device, parse, judge
from ctxbuild.toolchain.runtimes import PUBLISHED, parse_cli, runtime

V2_271 = "v2:6:2.51.0:5.51.0:75:57:8:0"  # onnxruntime-qnn 2.7.0, SM8650 (soc 57, v75, 8 MB VTCM)
V1_230 = "6:2.47.0:5.47.0:0.0.0:75:0"  # onnxruntime-qnn 2.3.0, v75
SM8650 = dict(htp_arch=75, vtcm_mb=8)


def test_parse_the_two_formats() -> None:
    v2 = parse(V2_271)
    assert (v2.format, v2.backend_id, v2.sdk_version, v2.backend_api_version) == (2, 6, (2, 51, 0), (5, 51, 0))
    assert (v2.htp_archs, v2.soc_models, v2.vtcm_mbs, v2.htp_usr_drv) == ((75,), (57,), (8,), False)
    v1 = parse(V1_230)
    assert (v1.format, v1.sdk_version, v1.backend_api_version, v1.context_blob_version) == (1, (2, 47, 0), (5, 47, 0), (0, 0, 0))
    assert (v1.htp_archs, v1.soc_models, v1.vtcm_mbs) == ((75,), (), ())
    multi = parse("v2:6:2.51.0:5.51.0:73,79:60,69:8,8:0")
    assert multi.htp_archs == (73, 79) and multi.soc_models == (60, 69)


@pytest.mark.parametrize("bad", ["", "garbage", "v3:6:2.51.0", "v2:6:2.51.0:5.51.0:75:57:0", "6:2.47:5.47.0:0.0.0:75:0",
                                 "v2:6:2.51.0:5.51.0:73,79:60:8:0", "6:2.47.0:5.47.0:0.0.0:+75:0"])
def test_malformed_info_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse(bad)


@pytest.mark.parametrize("info, device, expected", [
    # the case of issue 17: a QAIRT 2.51 binary on a QAIRT 2.47 runtime
    (V2_271, Device((2, 47, 0), **SM8650), Compatibility.UNSUPPORTED),
    (V2_271, Device((2, 51, 0), **SM8650), Compatibility.OPTIMAL),
    (V2_271, Device((2, 52, 3), **SM8650), Compatibility.OPTIMAL),  # forward: a newer runtime loads it
    (V2_271, Device((2, 51, 0), htp_arch=79, vtcm_mb=8), Compatibility.PREFER_RECOMPILATION),  # SM8750 is v79
    (V2_271, Device((2, 51, 0), htp_arch=73, vtcm_mb=8), Compatibility.UNSUPPORTED),  # v75 binary on v73
    (V2_271, Device((2, 51, 0), htp_arch=75, vtcm_mb=4), Compatibility.UNSUPPORTED),  # more VTCM than the SoC
    ("v2:6:2.51.0:5.51.0:75:57:0:0", Device((2, 51, 0), **SM8650), Compatibility.PREFER_RECOMPILATION),  # V2: VTCM unset
    ("v2:6:2.51.0:5.51.0:69:36:8:0", Device((2, 51, 0), htp_arch=73, vtcm_mb=8), Compatibility.UNSUPPORTED),  # v6x on v7x
    ("v2:6:2.51.0:5.51.0:73,79:60,69:8,8:0", Device((2, 51, 0), **SM8650), Compatibility.PREFER_RECOMPILATION),
    ("v2:6:2.51.0:5.51.0:75:57:8:1", Device((2, 51, 0), **SM8650), Compatibility.UNSUPPORTED),  # user-driver binary
    ("v2:7:2.51.0:5.51.0:75:57:8:0", Device((2, 51, 0), **SM8650), Compatibility.UNSUPPORTED),  # not the HTP
    (V1_230, Device((2, 47, 0), **SM8650), Compatibility.OPTIMAL),
    (V1_230, Device((2, 51, 0), **SM8650), Compatibility.OPTIMAL),
    (V1_230, Device((2, 47, 0), htp_arch=79, vtcm_mb=8), Compatibility.PREFER_RECOMPILATION),
    (V1_230, Device((2, 47, 0), htp_arch=73, vtcm_mb=8), Compatibility.UNSUPPORTED),
    # the EP compares backend API versions when it knows the device's, major.minor only (patch ignored)
    ("6:2.47.0:5.47.9:0.0.0:75:0", Device((2, 47, 0), backend_api_version=(5, 47, 0), **SM8650), Compatibility.OPTIMAL),
    ("6:2.47.0:5.51.0:0.0.0:75:0", Device((2, 47, 0), backend_api_version=(5, 47, 0), **SM8650), Compatibility.UNSUPPORTED),
])
def test_rules(info: str, device: Device, expected: Compatibility) -> None:
    verdict, reason = judge(parse(info), device)
    assert verdict == expected, reason


def test_reasons_name_the_cause() -> None:
    assert "compiled by QAIRT 2.51, newer than the runtime's QAIRT 2.47" in judge(parse(V2_271), Device((2, 47, 0), **SM8650))[1]
    assert "built for HTP v75, the SoC has v73" in judge(parse(V2_271), Device((2, 51, 0), htp_arch=73, vtcm_mb=8))[1]


def test_runtimes() -> None:
    assert PUBLISHED["2.3.0"] == "2.47.0" and PUBLISHED["2.7.0"] == "2.51.0"
    assert runtime({"onnxruntime-qnn": "2.3.0"}, "x").qairt == (2, 47, 0)
    assert parse_cli("qairt=2.47").max_ir == 13  # onnxruntime 1.24 (the plugin's oldest) unless told
    assert parse_cli("qairt=2.51,onnxruntime=1.32.0").max_ir == 14
    for bad, says in [("qairt=2.46", "older than the oldest onnxruntime-qnn release"),
                      ("onnxruntime-qnn=2.2.0", "not a published release"), ("qairt", "expected KEY=VERSION"),
                      ("qnn=2.47", "names `qairt` or `onnxruntime-qnn`"), ("qairt=2.x", "not MAJOR.MINOR"),
                      ("qairt=2.47,onnxruntime=1.20", "needs 1.24.2 or newer"),
                      ("onnxruntime-qnn=2.3.0,qairt=2.51", "ships QAIRT 2.47.0")]:
        with pytest.raises(UsageError, match=says):
            parse_cli(bad)


def test_gate_judges_ir_and_wrappers_without_ep_info() -> None:
    serves = [{"name": "SM8650", "soc_model": "57", "htp_arch": "75"}]
    fact = {"ep_compatibility_info": V2_271, "ir_version": 14, "qnn_sdk": "v2.51.0.1"}
    (row,) = gate.judge(fact, serves, parse_cli("qairt=2.51"))
    assert row["verdict"] == gate.WILL_NOT_LOAD and "ONNX IR 14: onnxruntime 1.24 opens IR <= 13" in row["reason"]
    (row,) = gate.judge(fact, serves, parse_cli("qairt=2.51,onnxruntime=1.32"))
    assert row["verdict"] == gate.LOADS
    # a wrapper of a binary made elsewhere (ctxbuild wrap): the binary's build id and the target decide
    prebuilt = {"ep_compatibility_info": None, "ir_version": 3, "qnn_sdk": "v2.49.40.260810104044"}
    assert gate.judge(prebuilt, serves, parse_cli("qairt=2.48"))[0]["verdict"] == gate.WILL_NOT_LOAD
    assert gate.judge(prebuilt, serves, parse_cli("onnxruntime-qnn=2.5.0"))[0]["verdict"] == gate.LOADS


def test_protowire_reads_what_onnx_reads(tmp_path: Path) -> None:
    node = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", ep_sdk_version="v2.51.0.26",
                            ep_cache_context=b"\x00\xff" * 1000, embed_mode=1)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                          [helper.make_tensor("c", TensorProto.FLOAT, [3], np.ones(3).tolist())])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("com.microsoft", 1)], ir_version=4)
    onnx.helper.set_model_props(m, {"ep_compatibility_info.QNNExecutionProvider": V2_271, "k": "välue"})
    onnx.save(m, tmp_path / "w.onnx")
    assert wrapper_facts(tmp_path / "w.onnx") == {
        "ir_version": 4, "metadata": {"ep_compatibility_info.QNNExecutionProvider": V2_271, "k": "välue"},
        "ep_sdk_versions": ["v2.51.0.26"], "binaries": [""]}  # embedded
    m.graph.node[0].attribute[1].s, m.graph.node[0].attribute[0].i = b"w_qnn.bin", 0  # ep_cache_context, embed_mode
    onnx.save(m, tmp_path / "external.onnx")
    assert wrapper_facts(tmp_path / "external.onnx")["binaries"] == ["w_qnn.bin"]
    (tmp_path / "cut.onnx").write_bytes((tmp_path / "w.onnx").read_bytes()[:-7])
    with pytest.raises(ValueError):
        wrapper_facts(tmp_path / "cut.onnx")
