"""adapter: one LoRA adapter for one compiled graph and target -> the `.onnx_adapter` that binds it.

Reads the adapter file (.onnx_adapter, .safetensors, .npz), maps its tensors to the slots of the compiled
wrapper (its optional inputs: graph inputs with a default initializer), checks shapes and dtypes, and
writes onnxruntime's adapter format with exactly the wrapper's slot names (onnxruntime refuses a
parameter the model does not have, so a bundle graph gets only its own slots).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.plan.action import Action
from ctxbuild.lora.adapters import bind_param, read_onnx_adapter, slot_defaults, wrapper_slot_spec, write_onnx_adapter
from ctxbuild.errors import ActionError
from ctxbuild.qnn.quantized_io import quantize, read_metadata


def summarize(action: Action) -> dict[str, Any]:
    params = read_onnx_adapter(Path(action.outputs["binding"]))
    return {"adapter": {"name": action.params["name"], "graph": action.params["graph"], "slots": sorted(params)}}


def run(ctx: Any) -> None:
    import onnx

    a = ctx.action
    wrapper = onnx.load(a.inputs["ctx"], load_external_data=False)
    defaults = slot_defaults(wrapper)
    if not defaults:
        raise ActionError(f"{a.inputs['ctx']}: the compiled model has no adapter slots",
                          "check adapters.slots in the recipe")
    # compile.quantized_io: such a slot takes the adapter's float values quantized with its encoding
    encodings = read_metadata(wrapper)
    types = {i.name: i.type.tensor_type.elem_type for i in wrapper.graph.input}
    if any(types[s] != onnx.TensorProto.FLOAT and s not in encodings for s in defaults if s in types):
        raise ActionError(f"{a.inputs['ctx']}: adapter slots with quantized I/O of unknown encoding",
                          "build the base with ctxbuild (compile.quantized_io records the encodings) or float I/O")
    spec = wrapper_slot_spec(wrapper)
    for role, path in a.inputs.items():  # a bundle's other graphs: their slots are known names too
        if role.startswith("peer:"):
            spec = {**wrapper_slot_spec(onnx.load(path, load_external_data=False)), **spec}
    values = bind_param(Path(a.inputs["adapter"]), spec, a.params)
    values = {k: quantize(v, encodings[k]) if k in encodings else v for k, v in values.items() if k in defaults}
    if not values:
        raise ActionError(f"{a.inputs['adapter']}: no tensor for a slot of graph '{a.params['graph']}'",
                          f"its slots: {', '.join(sorted(defaults))}")
    write_onnx_adapter(ctx.tmp_output("binding"), values)
