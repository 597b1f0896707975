"""LoRA adapters switched by alpha (onnxruntime-qnn's LoRA v3 "hot switch"): every adapter resident in one graph.

Each adapted MatMul/Gemm/Conv gets one low-rank branch holding all the adapters that target it, stacked along the
rank axis: down = X @ [A_0 | A_1 | ...] (R = r_0 + r_1 + ...), gated = down * lora_alpha[idx] (idx repeats adapter i
r_i times), Y = base(X) + gated @ [s_0 B_0 ; s_1 B_1 ; ...]. So Y = base(X) + sum_i lora_alpha[i] s_i X A_i B_i: two
MatMuls (Convs) per target whatever the number of adapters, and lora_alpha = 0 gives exactly the base.

The map (alpha index -> adapter name, rank, targets, scale, and each target's weight initializer) is stamped into the
model's metadata (`ctxbuild.lora_alpha`), carried into the wrappers, and read back by the verification, which merges
each adapter into those weights (W + s B A, the float model the adapter was trained for) as its reference.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxbuild.errors import ActionError
from ctxbuild.lora.adapters import read_file

if TYPE_CHECKING:
    import numpy as np

KEY = "ctxbuild.lora_alpha"  # metadata_props key of the alpha map (JSON)
OPS = ("MatMul", "Gemm", "Conv")
# `<prefix><module>.lora_A[.default][.weight]`: PEFT's names, with or without its `base_model.model.` prefix
_NAME = re.compile(r"^(?:base_model\.model\.|base_model\.)?(?P<module>.+?)\.lora_(?P<ab>[AB])(?:\.default)?(?:\.weight)?$")


def modules(path: Path, tensors: dict[str, str]) -> dict[str, dict[str, np.ndarray]]:
    """module -> {"A": ..., "B": ...} from an adapter file; `tensors` renames file names first (recipe `tensors:`)."""
    import numpy as np

    found: dict[str, dict[str, np.ndarray]] = {}
    for name, value in read_file(path).items():
        m = _NAME.match(tensors.get(name, name))
        if m is None:
            raise ActionError(f"{path}: tensor '{name}' is not a LoRA A/B weight (<module>.lora_A / <module>.lora_B)",
                              "map it under the adapter's `tensors:` (file name -> <module>.lora_A)")
        if not np.isfinite(value).all():
            raise ActionError(f"{path}: tensor '{name}' holds NaN or infinite values", "fix the adapter or leave it out")
        found.setdefault(m["module"], {})[m["ab"]] = value.astype(np.float32)
    if not found:
        raise ActionError(f"{path}: the adapter file holds no tensors")
    for module, ab in found.items():
        if set(ab) != {"A", "B"}:
            raise ActionError(f"{path}: module '{module}' has lora_{'A' if 'B' in ab else 'B'} missing",
                              "each adapted module needs both its lora_A and lora_B")
    return found


def find_target(model: Any, module: str, overrides: dict[str, str], path: Path) -> Any:
    """The MatMul/Gemm/Conv node `module` adapts: the recipe's `targets:` entry, else the node named like the module
    (also in exporters' path form, /model/layers.0/q_proj/MatMul), else the one whose weight is `<module>.weight`."""
    nodes = [n for n in model.graph.node if n.op_type in OPS]
    if module in overrides:
        hit = [n for n in nodes if n.name == overrides[module]]
        if not hit:
            raise ActionError(f"adapters.targets: '{overrides[module]}' (for module '{module}') is not a MatMul, Gemm or "
                              "Conv node of the model", "name the node as Netron shows it")
        return hit[0]

    def dotted(name: str) -> str:
        return name.replace("/", ".").strip(".")

    for rule in (lambda n: n.name == module,
                 lambda n: dotted(n.name) == f"{module}.{n.op_type}",
                 lambda n: len(n.input) > 1 and n.input[1] in (f"{module}.weight", module)):
        hit = [n for n in nodes if rule(n)]
        if len(hit) == 1:
            return hit[0]
    raise ActionError(f"{path}: module '{module}' matches no MatMul, Gemm or Conv node of the model",
                      f"map it under adapters.targets, e.g. targets: {{{module}: <node name>}}")


def _orient(node: Any, weight: Any, a: np.ndarray, b: np.ndarray, path: Path, module: str
            ) -> tuple[np.ndarray, np.ndarray, str]:
    """(down, up, the file's layout) with down/up in the target op's own layout: MatMul/Gemm [in, r] and [r, out]; Conv
    [r, in, kh, kw] and [out, r, 1, 1]. Files hold PEFT's layout ([r, in], [out, r]) or the MatMul one ([in, r], [r, out])."""
    dims = list(weight.dims)
    if node.op_type == "Conv":
        if len(a.shape) != 4 or list(a.shape[1:]) != dims[1:] or list(b.shape[:1]) != dims[:1] or b.shape[1] != a.shape[0]:
            raise ActionError(f"{path}: module '{module}': lora_A {list(a.shape)} / lora_B {list(b.shape)} do not fit "
                              f"Conv '{node.name}' (weight {dims})", "the adapter was trained for another base model")
        return a, b.reshape(b.shape[0], b.shape[1], 1, 1), "peft"
    n_in, n_out = dims if node.op_type == "MatMul" or not _attr(node, "transB", 0) else dims[::-1]
    if a.ndim == 2 and b.ndim == 2:
        if a.shape[1] == n_in and b.shape[0] == n_out and a.shape[0] == b.shape[1]:  # PEFT
            return a.T, b.T, "peft"
        if a.shape[0] == n_in and b.shape[1] == n_out and a.shape[1] == b.shape[0]:
            return a, b, "matmul"
    raise ActionError(f"{path}: module '{module}': lora_A {list(a.shape)} / lora_B {list(b.shape)} do not fit "
                      f"{node.op_type} '{node.name}' ({n_in} in, {n_out} out)",
                      "the adapter was trained for another base model")


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def attach(model: Any, spec: dict[str, Any], files: dict[str, Path]) -> dict[str, Any]:
    """Add the alpha input and one stacked branch per adapted node to `model` (in place); returns the alpha map."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    name = spec["input"]
    if any(i.name == name for i in model.graph.input) or any(t.name == name for t in model.graph.initializer):
        raise ActionError(f"adapters.input: '{name}' is already a tensor of the model", "choose another name")
    inits = {t.name: t for t in model.graph.initializer}
    branches: dict[str, dict[str, Any]] = {}  # node name -> its node, weight and stacked parts
    entries = []
    for index, a in enumerate(spec["adapters"]):
        path = files[a["name"]]
        targets, ranks = [], set()
        for module, ab in sorted(modules(path, a["tensors"]).items()):
            node = find_target(model, module, spec["targets"], path)
            if node.op_type == "Gemm" and _attr(node, "transA", 0):
                raise ActionError(f"{node.op_type} '{node.name}' has transA=1", "export it without transA")
            if node.op_type == "Conv" and _attr(node, "group", 1) != 1:
                raise ActionError(f"Conv '{node.name}' is grouped", "LoRA on grouped convolutions is not built")
            if len(node.input) < 2 or node.input[1] not in inits:
                raise ActionError(f"{node.op_type} '{node.name}' (module '{module}') has no constant weight",
                                  "adapt a node whose weight is an initializer")
            down, up, layout = _orient(node, inits[node.input[1]], ab["A"], ab["B"], path, module)
            b = branches.setdefault(node.name, {"node": node, "weight": node.input[1], "down": [], "up": [], "idx": []})
            if any(i == index for i in b["idx"]):
                raise ActionError(f"{path}: two modules of adapter '{a['name']}' adapt node '{node.name}'",
                                  "map each module to its own node under adapters.targets")
            r = down.shape[0] if node.op_type == "Conv" else down.shape[1]
            b["down"].append(down)
            b["up"].append(up * np.float32(a["scale"]))
            b["idx"] += [index] * r
            ranks.add(r)
            gemm = node.op_type == "Gemm"
            targets.append({"node": node.name, "op": node.op_type, "module": module, "weight": node.input[1],
                            "layout": layout, "transB": bool(gemm and _attr(node, "transB", 0)),
                            "gemm_alpha": float(_attr(node, "alpha", 1.0)) if gemm else 1.0})
        entries.append({"index": index, "name": a["name"], "rank": max(ranks), "scale": a["scale"],
                        "targets": targets})
    model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [len(spec["adapters"])]))
    for b in branches.values():
        node, conv = b["node"], b["node"].op_type == "Conv"
        stem = f"{name}/{node.name}"
        down = np.concatenate(b["down"], axis=0 if conv else 1)
        up = np.concatenate(b["up"], axis=1 if conv else 0)
        idx = np.asarray(b["idx"], np.int64)
        model.graph.initializer.extend([numpy_helper.from_array(down, f"{stem}/lora_down"),
                                        numpy_helper.from_array(up, f"{stem}/lora_up"),
                                        numpy_helper.from_array(idx, f"{stem}/index")])
        out = node.output[0]
        node.output[0] = f"{stem}/base"
        x = node.input[0]
        gate = [helper.make_node("Gather", [name, f"{stem}/index"], [f"{stem}/gate"], axis=0, name=f"{stem}/gate")]
        if conv:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray([1, len(idx), 1, 1], np.int64),
                                                                   f"{stem}/gate_shape"))
            gate.append(helper.make_node("Reshape", [f"{stem}/gate", f"{stem}/gate_shape"], [f"{stem}/gate4"],
                                         name=f"{stem}/gate4"))
            keep = {a.name: a for a in node.attribute if a.name in ("strides", "pads", "dilations", "auto_pad")}
            first = helper.make_node("Conv", [x, f"{stem}/lora_down"], [f"{stem}/down"], name=f"{stem}/down")
            first.attribute.extend(keep.values())
            second = helper.make_node("Conv", [f"{stem}/gated", f"{stem}/lora_up"], [f"{stem}/up"], name=f"{stem}/up")
        else:
            first = helper.make_node("MatMul", [x, f"{stem}/lora_down"], [f"{stem}/down"], name=f"{stem}/down")
            second = helper.make_node("MatMul", [f"{stem}/gated", f"{stem}/lora_up"], [f"{stem}/up"], name=f"{stem}/up")
        gated = helper.make_node("Mul", [f"{stem}/down", gate[-1].output[0]], [f"{stem}/gated"], name=f"{stem}/gated")
        add = helper.make_node("Add", [f"{stem}/base", f"{stem}/up"], [out], name=f"{stem}/add")
        at = list(model.graph.node).index(node) + 1
        for k, n in enumerate([*gate, first, gated, second, add]):
            model.graph.node.insert(at + k, n)
    return {"input": name, "adapters": entries}


def quantize_alpha_input(qdq_model: Path, name: str) -> None:
    """Give the alpha input of a QDQ model its own QuantizeLinear/DequantizeLinear, with the encoding the quantizer
    gave the gates it feeds (calibrated on 0 and 1: scale 1/65535, zero point 0 at 16 bits). onnxruntime's quantizer
    leaves a Gather's graph input float; so quantized, the binary takes lora_alpha as codes (uint16 at int16), as
    LoRA v3 describes, and the quantized-I/O wrapper exposes them."""
    import onnx
    from onnx import helper

    model = onnx.load(str(qdq_model), load_external_data=False)
    g = model.graph
    gathers = [n for n in g.node if n.op_type == "Gather" and n.input[0] == name]
    q = next((n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == gathers[0].output[0]), None)
    if q is None:
        raise ActionError(f"the quantizer left the gate of '{name}' float", "report this model to ctxbuild")
    dq = f"{name}_DequantizeLinear_Output"
    for n in gathers:
        n.input[0] = dq
    g.node.insert(0, helper.make_node("DequantizeLinear", [f"{name}_QuantizeLinear_Output", *q.input[1:]], [dq],
                                      name=f"{name}_DequantizeLinear", domain=q.domain))  # com.microsoft below opset 21
    g.node.insert(0, helper.make_node("QuantizeLinear", [name, *q.input[1:]], [f"{name}_QuantizeLinear_Output"],
                                      name=f"{name}_QuantizeLinear", domain=q.domain))
    onnx.save(model, str(qdq_model))


def stamp(model: Any, alpha_map: dict[str, Any]) -> None:
    from onnx import helper

    helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, KEY: json.dumps(alpha_map)})


def read_map(model: Any) -> dict[str, Any] | None:
    """The alpha map of a prepared model or wrapper, None when it has none."""
    return next((json.loads(p.value) for p in model.metadata_props if p.key == KEY), None)


def deltas(alpha_map: dict[str, Any], spec: dict[str, Any], files: dict[str, Path]) -> list[dict[str, np.ndarray]]:
    """Per adapter (alpha index): weight initializer -> s B A in the weight's own layout (what merging adds)."""
    import numpy as np

    out = []
    for entry, a in zip(alpha_map["adapters"], spec["adapters"]):
        mods = modules(files[a["name"]], a["tensors"])
        d: dict[str, np.ndarray] = {}
        for t in entry["targets"]:
            ab = mods[t["module"]]
            if t["op"] == "Conv":
                delta = np.einsum("or,rikl->oikl", ab["B"].reshape(ab["B"].shape[:2]), ab["A"])
            else:
                delta = ab["A"].T @ ab["B"].T if t["layout"] == "peft" else ab["A"] @ ab["B"]  # [in, out]
                delta = delta.T if t["transB"] else delta
            d[t["weight"]] = d.get(t["weight"], 0) + delta * np.float32(a["scale"] / t["gemm_alpha"])
        out.append(d)
    return out
