"""The baseline: a plain in-process Python loop making the same onnxruntime calls ctxbuild's actions make.

Usage: python bench/loop_baseline.py RECIPES_DIR OUT_DIR TARGET...   (int16, soc table from ctxbuild)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_qnn
from onnxruntime.quantization import QuantType, quantize
from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

from ctxbuild.recipes.targets import lookup


def main(recipes: Path, out: Path, targets: list[str]) -> None:
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    for model in sorted((recipes / "models").glob("m*.onnx")):
        work = out / "work" / model.stem
        work.mkdir(parents=True, exist_ok=True)
        m = onnx.load(model)  # prepare: IR stamp, shapes already fixed, ORT basic optimizer
        m.ir_version = min(m.ir_version, 13)
        onnx.save(m, work / "staged.onnx")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(work / "prepared.onnx")
        ort.InferenceSession(str(work / "staged.onnx"), so, providers=["CPUExecutionProvider"])
        cal = recipes / "models" / model.stem.replace("m", "cal")
        samples = [{"image": np.load(p)["image"]} for p in sorted(cal.glob("*.npz"))]
        it = iter(samples)

        class Reader:
            def get_next(self):  # noqa: ANN202
                return next(it, None)

        cfg = get_qnn_qdq_config(str(work / "prepared.onnx"), Reader(), activation_type=QuantType.QUInt16,
                                 weight_type=QuantType.QUInt8)
        quantize(str(work / "prepared.onnx"), str(work / "quantized.onnx"), cfg)
        for t in targets:
            soc = lookup(t)
            so = ort.SessionOptions()
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            so.add_provider_for_devices(devices, {"backend_type": "htp", "soc_model": str(soc.soc_model),
                                                  "htp_arch": str(soc.htp_arch), "vtcm_mb": str(soc.vtcm_mb)})
            dst = out / t / model.stem
            dst.mkdir(parents=True, exist_ok=True)
            ort.ModelCompiler(so, str(work / "quantized.onnx"),
                              embed_compiled_data_into_model=False).compile_to_file(str(dst / f"{model.stem}_ctx.onnx"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
