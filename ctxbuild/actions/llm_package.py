"""llm_package: genai_config.json for onnxruntime-genai's decoder pipeline, generated from what was compiled.

The pipeline (ctxbuild/llm/genai_config.py) runs each part's wrappers at the largest context length (genai runs
one CL), the prompt-window graph and the AR-1 graph, with their input and output names read from the wrappers
themselves, so the config cannot drift from them; the small stages around them (genai's 2-D mask to the graphs'
4-D one, its KV cache into and out of each part) are written beside it and run on the CPU EP.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ctxbuild.llm import genai_config
from ctxbuild.llm.layout import Layout

QNN = {"log_id": "onnxruntime-genai", "provider_options": [{"qnn": {"backend_type": "htp"}}]}


def run(ctx: Any) -> None:
    import onnx

    a, p = ctx.action, ctx.action.params
    layout = Layout.read(Path(a.inputs["layout"]))
    cl = max(p["context_lengths"])
    parts = {}
    for g in layout.graphs:
        if g.cl == cl:
            m = onnx.load(a.inputs[f"ctx:{g.name}"], load_external_data=False)
            parts[(g.part, g.ar)] = (Path(a.inputs[f"ctx:{g.name}"]).name, [i.name for i in m.graph.input],
                                     [o.name for o in m.graph.output])
    config = genai_config.pipeline_config(layout, cl, parts, QNN)
    for name, model in genai_config.helper_models(layout, cl).items():
        onnx.save(model, str(ctx.tmp_output(f"stage:{name}")))
    for role, src in a.inputs.items():
        if role.startswith("tokenizer:"):
            shutil.copyfile(src, ctx.tmp_output(role))
    ctx.tmp_output("config").write_text(json.dumps(config, indent=2) + "\n")
    print(f"genai_config.json: {len(config['model']['decoder']['pipeline'])} stages at CL {cl}")
