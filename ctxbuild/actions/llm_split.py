"""llm_split: a dynamic decoder -> its static graphs per (part, AR, CL) (ctxbuild/llm/static.py), then the check
that makes the rewrite trustworthy: chained on the CPU, the static graphs decode the same greedy tokens as the
original model on the recipe's prompts, at every context length. That decode records each part's calls for the
per-part checks (ctxbuild/llm/records.py). The original's greedy tokens, as many as the genai check compares
(check.original_tokens), are kept in layout.json: the only action that holds the original model is this one."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError
from ctxbuild.graph.modelio import external_data_files, load
from ctxbuild.llm import export_config
from ctxbuild.llm.ar_sessions import one_ar_runner
from ctxbuild.llm.layout import Layout
from ctxbuild.llm.static import records_role
from ctxbuild.llm.prompts import load_prompts, prompt_files, tokenizer_of
from ctxbuild.lora.adapters import slot_defaults_of
from ctxbuild.plan.action import Action


def discover_inputs(action: Action) -> dict[str, Path]:
    return {**export_files(Path(action.inputs["model"])), **prompt_files(Path(action.watch[0]), action.params["check"]["prompts"])}


def export_files(model: Path) -> dict[str, Path]:
    """What reading the user's export reads beside `model`: its external data and its exporter's config files
    (they fix dims and token ids)."""
    return {**external_data_files(load(model, external_data=False), model, follow_links=True),
            **{f"export:{n}": p for n, p in export_config.files(model).items()}}


def readable(src: Path, into: Path) -> Path:
    """`src` as onnx and onnxruntime read it: both refuse external data that is a symlink out of the model's
    directory (a Hugging Face cache's snapshot layout), and onnx a hardlinked one too, so such a model is read
    from copies in `into` (the action's private directory, removed after it), its exporter configs beside it."""
    data = external_data_files(load(src, external_data=False), src, follow_links=True)
    if not any(p.is_symlink() or p.stat().st_nlink > 1 for p in data.values()):  # `cp -al`, a dedup tool's links
        return src
    names = {src.name: src, **export_config.files(src), **{r.removeprefix("external:"): p for r, p in data.items()}}
    for name, path in names.items():
        dst = into / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dst)
    return into / src.name


def run(ctx: Any) -> None:
    from ctxbuild.llm import pipeline, records, static
    from ctxbuild.llm.canonical import NotADecoder

    a, p = ctx.action, ctx.action.params
    given = Path(a.inputs["model"])
    src = readable(given, ctx.tmp / "source")
    ars, cls = p["sequence_lengths"], p["context_lengths"]
    graphs = static.specs(p["parts"], ars, cls)
    dst = {g.name: ctx.tmp_output(f"model:{g.name}") for g in graphs}
    weights = [ctx.tmp_output(static.weights_role(part)) for part in range(p["parts"])]
    try:
        shape = static.write_static_graphs(src, p["parts"], ars, cls, dst, weights, p.get("adapter_slots"),
                                           _alpha(a) if "alpha" in p else None)
    except NotADecoder as e:
        raise ActionError(f"{given}: {e}") from None
    # LoRA slots the model takes as inputs: the original is checked with their defaults (zeros), as the graphs hold them
    slots = {n: v for path in dst.values() for n, v in slot_defaults_of(path).items()} if p.get("adapter_slots") else {}
    ranges = static.part_ranges(shape.layers, p["parts"])
    tokens = p["check"]["tokens"]
    prompts = load_prompts(prompt_files(Path(a.watch[0]), p["check"]["prompts"]), p["check"]["prompts"],
                           tokenizer_of(a))
    # one set of sessions at a time (the original's, then each CL's graphs at one AR): peak memory stays near one
    # copy of the weights however many CLs and ARs there are
    reference = [pipeline.reference_generate(src, prompt, max(tokens, p["check"]["original_tokens"]), slots).tokens
                 for prompt in prompts]
    recorder = records.Recorder(max(ars))  # the calls the per-part checks replay (llm/records.py)
    for cl in cls:
        run_cpu = one_ar_runner({(g.part, g.ar, g.cl): dst[g.name] for g in graphs if g.cl == cl})
        for i, (prompt, original) in enumerate(zip(prompts, reference)):
            want = original[:tokens]
            try:
                got = pipeline.generate(recorder.runner(run_cpu), ranges, (shape.kv_heads, shape.head_dim), prompt, tokens, cl, max(ars)).tokens
            except ValueError as e:
                raise ActionError(f"{a.recipe_files[0]}: prompt {i}: {e}",
                                  "use shorter prompts, fewer llm.generate tokens or larger context_lengths") from None
            if got != want:
                first = next(k for k, (x, y) in enumerate(zip(got, want)) if x != y)
                raise ActionError(f"{given}: the static graphs at CL {cl} decode prompt {i} differently from the "
                                  f"original model from token {first} on ({got[first]} vs {want[first]})",
                                  "the model is not in the convention ctxbuild rewrites (docs/llm.md); report it")
        del run_cpu
    print(f"{len(prompts)} prompts: the static graphs reproduce the original's {tokens} greedy tokens at CL "
          f"{', '.join(map(str, cls))}")
    for part in range(p["parts"]):
        recorder.write(part, ctx.tmp_output(records_role(part)))
    if "alpha" in p:  # each adapter's lora_alpha (one-hot): what the llm actions bind as that adapter
        _one_hots(ctx, p["alpha"])
    export = export_config.read(src)
    Layout(shape.layers, shape.kv_heads, shape.head_dim, shape.vocab, shape.hidden, ranges, graphs, reference,
           export.special, export.search).write(ctx.tmp_output("layout"))


def _alpha(a: Action) -> tuple[dict[str, Any], dict[str, Path]]:
    spec = a.params["alpha"]
    return spec, {x["name"]: Path(a.inputs[f"alpha:{x['name']}"]) for x in spec["adapters"]}


def _one_hots(ctx: Any, spec: dict[str, Any]) -> None:
    import numpy as np

    n = len(spec["adapters"])
    for i, x in enumerate(spec["adapters"]):
        with open(ctx.tmp_output(f"alpha:{x['name']}"), "wb") as f:
            np.savez(f, **{spec["input"]: np.eye(n, dtype=np.float32)[i]})


def summarize(action: Action) -> dict[str, Any]:
    return {"graphs": action.params["graphs"]}
