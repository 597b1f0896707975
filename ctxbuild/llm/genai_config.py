"""onnxruntime-genai's decoder pipeline over the part graphs: genai_config.json and the small stages it needs.

What genai feeds a `decoder-pipeline` with `sliding_window` (measured with onnxruntime-genai 0.18.0 on the CPU EP;
its source: src/models/position_inputs.cpp, input_ids.cpp, kv_cache.cpp): the prompt padded at the front
(`alignment: right`) to whole windows of `window_size` tokens; `input_ids` and `position_ids` [1, window] per
window, then [1, 1] per generated token; `attention_mask` int64 [1, context_length], 1 for valid cache slots, laid
out like the graphs' cache (past positions right-aligned in the first CL - AR slots, the new ones last). With
`past_present_share_buffer` it keeps one zeroed cache buffer per layer and K/V, [1, kv_heads, CL, head_dim], passed
as both past and present. The part graphs take a 4-D additive float mask and CL - AR past slots and return only
the AR new positions, so around them run small CPU stages: a mask stage per AR (`mask_model`) and a KV stage into
and out of each part graph (`kv_models`: the buffer is a shift register of the last CL positions, which is the
layout genai's mask describes). genai's own mask and cache get names of their own (MASK_2D, `cache.N.*`).
The device config names the compiled wrappers (QNN EP per stage); `twin_config` / `write_twin` make its CPU twin:
the shipped config with CPU graphs in their place, which the build runs (actions/llm_genai.py) and writes out.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ctxbuild.llm.canonical import MASK_NEG
from ctxbuild.llm.layout import Layout

MASK_2D = "attention_mask_2d"  # genai's mask; the graphs' 4-D one keeps the name `attention_mask`
# genai pads the prompt with the pad id and masks every slot holding it. The export's own id is used; only a model
# with no exporter config beside it (no id to read) gets 0, and then no prompt token may be 0.
PAD_TOKEN = 0
OPSET, IR = 17, 8  # the stages are plain ONNX, readable by any onnxruntime genai ships with


def mask_model(ar: int, cl: int) -> Any:
    """int64 [1, CL] (1 = valid slot) -> float [1, 1, AR, CL]: 0 where a query may attend, MASK_NEG elsewhere."""
    from onnx import TensorProto, helper, numpy_helper

    allowed = np.ones((ar, cl), np.float32)
    allowed[:, cl - ar:] = np.tril(np.ones((ar, ar), np.float32))  # the new positions: causal among themselves
    nodes = [helper.make_node("Cast", [MASK_2D], ["valid"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["valid", "causal"], ["both"]),
             helper.make_node("Sub", ["both", "one"], ["shifted"]),  # 0 where allowed, -1 elsewhere
             helper.make_node("Mul", ["shifted", "neg"], ["mask"]),
             helper.make_node("Unsqueeze", ["mask", "axes"], ["attention_mask"])]
    inits = [numpy_helper.from_array(allowed, "causal"), numpy_helper.from_array(np.array(1, np.float32), "one"),
             numpy_helper.from_array(np.array(-MASK_NEG, np.float32), "neg"),
             numpy_helper.from_array(np.array([0, 1], np.int64), "axes")]
    g = helper.make_graph(nodes, f"mask_ar{ar}_cl{cl}", [helper.make_tensor_value_info(MASK_2D, TensorProto.INT64, [1, cl])],
                          [helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, [1, 1, ar, cl])], inits)
    return _model(g)


def kv_models(layers: range, ar: int, cl: int, kv_heads: int, head_dim: int) -> tuple[Any, Any]:
    """(into, out of) one part graph at AR, over genai's cache `cache.N.key/value` [1, H, CL, D], one buffer it
    passes as past and present (`past_present_share_buffer`), kept as a shift register of the last CL positions:
    into: its last CL - AR positions -> past_key_values [1, H, CL - AR, D];
    out of: those and the graph's present [1, H, AR, D] -> `cache_present.N.*` [1, H, CL, D] (shifted by AR)."""
    from onnx import TensorProto, helper, numpy_helper

    names = [(i, kv) for i in layers for kv in ("key", "value")]
    inits = [numpy_helper.from_array(np.array([ar], np.int64), "start"),
             numpy_helper.from_array(np.array([cl], np.int64), "end"),
             numpy_helper.from_array(np.array([2], np.int64), "axis")]
    into = [helper.make_node("Slice", [f"cache.{i}.{kv}", "start", "end", "axis"], [f"past_key_values.{i}.{kv}"])
            for i, kv in names]
    out = [n for i, kv in names for n in (
        helper.make_node("Slice", [f"cache.{i}.{kv}", "start", "end", "axis"], [f"cache.{i}.{kv}/kept"]),
        helper.make_node("Concat", [f"cache.{i}.{kv}/kept", f"present.{i}.{kv}"], [f"cache_present.{i}.{kv}"], axis=2))]

    def vi(name: str, n: int) -> Any:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, kv_heads, n, head_dim])

    cache = [vi(f"cache.{i}.{kv}", cl) for i, kv in names]
    g_in = helper.make_graph(into, f"kv_into_ar{ar}_cl{cl}", cache, [vi(f"past_key_values.{i}.{kv}", cl - ar) for i, kv in names],
                             inits)
    g_out = helper.make_graph(out, f"kv_out_ar{ar}_cl{cl}", cache + [vi(f"present.{i}.{kv}", ar) for i, kv in names],
                              [vi(f"cache_present.{i}.{kv}", cl) for i, kv in names], inits)
    return _model(g_in), _model(g_out)


def _model(g: Any) -> Any:
    from onnx import helper

    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = IR
    return m


def _stage(name: str, filename: str, inputs: list[str], outputs: list[str], ar: int, window: int,
           session_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """One pipeline entry: prompt-window stages skip token generation and AR-1 stages skip the prompt."""
    s: dict[str, Any] = {"filename": filename, "inputs": inputs, "outputs": outputs}
    if session_options is not None:
        s["session_options"] = session_options
    s["run_on_token_gen" if ar == window else "run_on_prompt"] = False
    return {name: s}


def _tag(part: int, parts: int, ar: int, cl: int) -> str:
    return f"ar{ar}_cl{cl}_{part + 1}_of_{parts}"


def helper_names(parts: int, ars: list[int], cl: int) -> list[str]:
    """The files of the stages around the part graphs (what helper_models writes), for the plan's outputs."""
    return [f"mask_ar{ar}_cl{cl}.onnx" for ar in ars] + [
        f"kv_{d}_{_tag(p, parts, ar, cl)}.onnx" for p in range(parts) for ar in ars for d in ("into", "out")]


def helper_models(layout: Layout, cl: int) -> dict[str, Any]:
    """file name -> model: a mask stage per AR, the KV stages into and out of each part graph."""
    ars = sorted({g.ar for g in layout.graphs}, reverse=True)
    out = {f"mask_ar{ar}_cl{cl}.onnx": mask_model(ar, cl) for ar in ars}
    for p, (start, stop) in enumerate(layout.parts):
        for ar in ars:
            into, back = kv_models(range(start, stop), ar, cl, layout.kv_heads, layout.head_dim)
            out[f"kv_into_{_tag(p, len(layout.parts), ar, cl)}.onnx"] = into
            out[f"kv_out_{_tag(p, len(layout.parts), ar, cl)}.onnx"] = back
    return out


def pipeline_config(layout: Layout, cl: int, parts: dict[tuple[int, int], tuple[str, list[str], list[str]]],
                    session_options: dict[str, Any] | None) -> dict[str, Any]:
    """genai_config.json: the mask stages, then per part and AR (prompt window first) the KV stage into the
    part graph, the graph (`parts[(part, ar)]` = file name, inputs, outputs; run with `session_options`),
    the KV stage out of it. The helper stages run on the CPU EP, where genai keeps the cache."""
    ars = sorted({g.ar for g in layout.graphs}, reverse=True)
    window, helpers = ars[0], helper_models(layout, cl)
    stages = [_stage(f"mask_ar{ar}_cl{cl}", f"mask_ar{ar}_cl{cl}.onnx", [MASK_2D], ["attention_mask"], ar, window)
              for ar in ars]
    for p in range(len(layout.parts)):
        for ar in ars:
            tag = _tag(p, len(layout.parts), ar, cl)
            into, back = helpers[f"kv_into_{tag}.onnx"], helpers[f"kv_out_{tag}.onnx"]
            filename, ins, outs = parts[(p, ar)]
            stages += [_stage(f"kv_into_{tag}", f"kv_into_{tag}.onnx", [i.name for i in into.graph.input],
                              [o.name for o in into.graph.output], ar, window),
                       _stage(Path(filename).stem, filename, ins, outs, ar, window, session_options),
                       _stage(f"kv_out_{tag}", f"kv_out_{tag}.onnx", [i.name for i in back.graph.input],
                              [o.name for o in back.graph.output], ar, window)]
    pad = layout.special.get("pad_token_id", PAD_TOKEN)
    ids = {k: layout.special[k] for k in ("bos_token_id", "eos_token_id") if k in layout.special}
    return {
        "model": {
            "type": "decoder-pipeline", "context_length": cl, "vocab_size": layout.vocab, **ids, "pad_token_id": pad,
            "decoder": {
                "head_size": layout.head_dim, "hidden_size": layout.hidden,
                "num_attention_heads": layout.hidden // layout.head_dim, "num_key_value_heads": layout.kv_heads,
                "num_hidden_layers": layout.layers,
                "inputs": {"input_ids": "input_ids", "attention_mask": MASK_2D, "position_ids": "position_ids",
                           "past_key_names": "cache.%d.key", "past_value_names": "cache.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "cache_present.%d.key",
                            "present_value_names": "cache_present.%d.value"},
                "sliding_window": {"window_size": window, "pad_value": pad, "alignment": "right",
                                   "slide_key_value_cache": False},  # genai's default cache, not its uint8 one
                "pipeline": stages,
            },
        },
        # the export's decoding options; the cache and length are the static graphs'
        "search": {**layout.search, "max_length": cl, "do_sample": layout.search.get("do_sample", False),
                   "past_present_share_buffer": True},
    }


def twin_config(shipped: dict[str, Any], graphs: dict[str, str], stages: str = "",
                session_options: dict[str, str] | None = None) -> dict[str, Any]:
    """The CPU twin of a shipped config: each stage whose file is a key of `graphs` (a compiled part's wrapper) runs
    that graph file instead, on the CPU EP (its `session_options` go, or become `session_options`); the other
    stages' files get the prefix `stages`. Everything else (ids, search options, every stage's inputs and outputs)
    is the shipped config's."""
    config = copy.deepcopy(shipped)
    replaced = set()
    for entry in config["model"]["decoder"]["pipeline"]:
        for stage in entry.values():
            if stage["filename"] in graphs:
                replaced.add(stage["filename"])
                stage["filename"] = graphs[stage["filename"]]
                stage.pop("session_options", None)
                if session_options:
                    stage["session_options"] = dict(session_options)
            else:
                stage["filename"] = stages + stage["filename"]
    if missing := sorted(set(graphs) - replaced):
        raise ValueError(f"the config names no stage running {', '.join(missing)}")
    return config


def write_twin(shipped: Path, graphs: dict[str, Path], dst: Path,
               copy_file: Callable[[Path, Path], Any] | None = None,
               session_options: dict[str, str] | None = None) -> Path:
    """`dst` as a directory onnxruntime-genai runs on a PC: twin_config of the config at `shipped` with `graphs`
    (shipped wrapper file name -> graph). With `copy_file(src, dst)`, the helper stages beside `shipped` and each
    graph with the external data files it names are copied in: a directory of its own. Without, `dst` holds only
    the config and a symbolic link per directory holding those files: genai takes only paths under its config's
    directory, and onnx refuses a weight file that is a symlink or has a second hard link (one would break any
    other action reading the same graph meanwhile), while a linked directory is followed. `session_options`: the
    graphs' stages' (twin_config)."""
    from ctxbuild.graph.modelio import external_data_files, load

    dst.mkdir(parents=True, exist_ok=True)
    shipped_config = json.loads(shipped.read_text())
    if copy_file is None:
        dirs = {d: f"d{i}" for i, d in enumerate(dict.fromkeys([shipped.parent, *(g.parent for g in graphs.values())]))}
        for d, name in dirs.items():
            (dst / name).symlink_to(d.resolve(), target_is_directory=True)
        config = twin_config(shipped_config, {w: f"{dirs[g.parent]}/{g.name}" for w, g in graphs.items()},
                             f"{dirs[shipped.parent]}/", session_options)
    else:
        config = twin_config(shipped_config, {w: g.name for w, g in graphs.items()}, "", session_options)
        for entry in config["model"]["decoder"]["pipeline"]:
            for stage in entry.values():
                if stage["filename"] not in {g.name for g in graphs.values()}:
                    copy_file(shipped.parent / stage["filename"], dst / stage["filename"])
        for graph in graphs.values():
            files = {graph.name: graph, **{r.removeprefix("external:"): p for r, p in
                                          external_data_files(load(graph, external_data=False), graph).items()}}
            for name, src in files.items():
                if not (dst / name).exists():  # a data file several graphs share is copied once
                    (dst / name).parent.mkdir(parents=True, exist_ok=True)
                    copy_file(src, dst / name)
    (dst / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dst
