"""llm_package: genai_config.json for onnxruntime-genai's decoder pipeline, generated from what was compiled.

The pipeline lists each part's wrappers at the largest context length (onnxruntime-genai runs one CL):
the prompt graph (run_on_token_gen: false) and the token graph (run_on_prompt: false) per part, in order,
with their input and output names read from the wrappers themselves, so the config cannot drift from them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.llm.layout import Layout
from ctxbuild.llm.convention import MASK_NEG


def run(ctx: Any) -> None:
    import onnx

    a, p = ctx.action, ctx.action.params
    layout = Layout.read(Path(a.inputs["layout"]))
    cl = max(p["context_lengths"])
    stages = []
    for g in layout.graphs:
        if g.cl != cl:
            continue
        wrapper = Path(a.inputs[f"ctx:{g.name}"])
        m = onnx.load(str(wrapper), load_external_data=False)
        stage: dict[str, Any] = {
            "filename": wrapper.name,
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": [{"qnn": {"backend_type": "htp"}}]},
            "inputs": [i.name for i in m.graph.input], "outputs": [o.name for o in m.graph.output]}
        if g.ar == 1:
            stage["run_on_prompt"] = False
        else:
            stage["run_on_token_gen"] = False
        stages.append({g.name: stage})
    heads = layout.hidden // layout.head_dim
    config = {
        "model": {
            "type": "decoder-pipeline",
            "context_length": cl,
            "vocab_size": layout.vocab,
            "decoder": {
                "head_size": layout.head_dim, "hidden_size": layout.hidden, "num_attention_heads": heads,
                "num_key_value_heads": layout.kv_heads, "num_hidden_layers": layout.layers,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "sliding_window": {"window_size": max(g.ar for g in layout.graphs), "pad_value": 0,
                                   "alignment": "left", "slide_key_value_cache": False},
                "pipeline": stages,
            },
        },
        "search": {"max_length": cl, "do_sample": False},
    }
    ctx.tmp_output("config").write_text(json.dumps(config, indent=2) + "\n")
    print(f"genai_config.json: {len(stages)} stages at CL {cl}; the attention mask is additive ({MASK_NEG} masked)")
