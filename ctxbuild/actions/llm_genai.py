"""llm_genai: the genai_config.json a target ships, run by onnxruntime-genai on its CPU twin, against the original
export's greedy tokens; and that twin written out for a PC.

The shipped config (llm_package's, byte for byte, its helper stages beside it) runs with each compiled part's
wrapper replaced by the part's float static graph (ctxbuild/llm/genai_config.py twin_config: the stage's file and
EP change, nothing else). llm_split proved those graphs decode the original's tokens under ctxbuild's own decoder,
so a difference here is the config's or the pipeline stages' (a wrong pad/bos/eos id, a stage wired wrong), not
quantization's (llm_eval measures that). genai decodes greedily (sampling options off) from each verification
prompt; its tokens must equal the original export's first `tokens` (onnxruntime on the user's model, decoded by
llm_split and kept in layout.json: the original is never loaded here), up to an EOS, as many as the config's
context length leaves after the prompt padded to whole windows. Any other token fails the action, which fails the
build and keeps the config out of OUT/<target>/ (engine/finish.py ship_only_verified).

Memory: genai opens every stage's session at once, a part's AR graphs each in a session of its own over the part's
one weight file. onnxruntime maps that file and, by default, packs each MatMul's weights into a copy per session
(twice the float weights for 2 ARs); the float twin's stages run with prepacking off (SHARED), so the sessions
read the mapped file in place: its pages once in memory, whatever the number of ARs.

`cpu_twin/` beside the config is the same twin with the graphs that were compiled (QDQ, float for fp16), copied:
the pipeline a user runs on a PC before the device; it is run here on the first prompt, its tokens recorded.
"""
from __future__ import annotations

import json
import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError
from ctxbuild.llm.layout import Layout
from ctxbuild.llm.prompts import load_prompts, prompt_files, tokenizer_of
from ctxbuild.machine import peak_rss, proportional_set_size
from ctxbuild.plan.action import Action

INSTALL_HINT = "pip install onnxruntime-genai==0.18.0 (a ctxbuild dependency; docs/llm.md)"
# the float twin's part stages: weights read from the mapped file, not packed into a copy per session (above);
# the same tokens (measured on a 482 MB decoder, 2 ARs: anonymous memory 785 -> 71 MB)
SHARED = {"session.disable_prepacking": "1"}


def discover_inputs(action: Action) -> dict[str, Path]:
    return prompt_files(Path(action.watch[0]), action.params["prompts"])


def key_extras(action: Action) -> dict[str, Any]:
    from ctxbuild.toolchain import installed

    return {"onnxruntime-genai": installed.version("onnxruntime-genai")}


def summarize(action: Action) -> dict[str, Any]:
    return {"result": json.loads(Path(action.outputs["result"]).read_text())}


def run(ctx: Any) -> None:
    from ctxbuild.cache.files import copy_hashing
    from ctxbuild.llm import genai_config

    try:
        import onnxruntime_genai as og
    except ImportError as e:
        raise ActionError(f"onnxruntime-genai cannot be imported ({e}), so the shipped genai_config.json was not run",
                          INSTALL_HINT) from None
    a, p = ctx.action, ctx.action.params
    shipped = Path(a.inputs["config"])
    config = json.loads(shipped.read_text())
    prompts = load_prompts(prompt_files(Path(a.watch[0]), p["prompts"]), p["prompts"], tokenizer_of(a))
    want = [w[:p["tokens"]] for w in Layout.read(Path(a.inputs["layout"])).reference_tokens]
    eos = config["model"].get("eos_token_id")
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    float_twin = genai_config.write_twin(shipped, {w: Path(a.inputs[f"float:{g}"]) for w, g in p["wrappers"].items()},
                                         ctx.tmp / "float", session_options=SHARED)  # linked, not copied
    held: dict[str, int] = {}
    got = _decode(og, float_twin, prompts, p["tokens"], held)
    # the record's peak_rss is the whole action's and counts the mapped part files once per AR session: what the
    # float twin's decode set, and what it held (PSS: each page once), which is what the estimate models
    ctx.facts["peak_rss_float_twin"] = peak_rss()
    ctx.facts["held_float_twin"] = held.get("pss")
    compared, diff = first_difference(want, got, eos)
    ids = {k: config["model"].get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    result: dict[str, Any] = {
        "graph": "genai_config.json", "method": f"onnxruntime-genai {og.__version__}, the shipped config on its CPU "
        "twin (float static graphs) against the original export", "prompts": len(prompts),
        "tokens_per_prompt": p["tokens"], "tokens_compared": compared, "ids": ids,
        "first_difference": None if diff is None else dict(zip(("prompt", "position", "genai", "original"), diff)),
        "passed": diff is None and sum(compared) > 0, "outputs": {}}

    if result["passed"]:  # the twin a user runs: the compiled graphs, copied out; run once to show it loads and decodes
        twin = genai_config.write_twin(shipped, {w: Path(a.inputs[f"twin:{g}"]) for w, g in p["wrappers"].items()},
                                       ctx.tmp / "cpu_twin", partial(copy_hashing, durable=False))  # reflinks if it can
        for role in a.outputs:
            if role.startswith("tokenizer:"):
                shutil.copyfile(a.inputs[role], twin / Path(a.outputs[role]).name)
        (tokens, _), = _decode(og, twin, prompts[:1], p["tokens"])
        result["cpu_twin"] = {"graphs": p["twin"], "prompt": 0, "tokens": tokens,
                              "equal_to_original": sum(x == y for x, y in zip(tokens, want[0]))}
        for role, path in a.outputs.items():  # the runner takes outputs from the top of the temp directory
            if role != "result":
                os.replace(twin / Path(path).name, ctx.tmp_output(role))
    if diff is not None:
        i, k, g, w = diff
        raise ActionError(f"{a.recipes[0]}@{a.target['name']}: onnxruntime-genai running the shipped genai_config.json "
                          f"(bos/eos/pad ids {ids['bos_token_id']}/{ids['eos_token_id']}/{ids['pad_token_id']}) decodes "
                          f"prompt {i} differently from the original export from token {k} on (genai id {g}, the export's {w})",
                          "check those ids: they come from the export's genai_config.json, generation_config.json, "
                          "config.json or tokenizer_config.json beside the model; if they are right, the pipeline's "
                          "stages are at fault: report it (docs/llm.md)", details=result)
    if not result["passed"]:
        raise ActionError(f"{a.recipes[0]}@{a.target['name']}: no token to compare: every prompt padded to whole "
                          f"windows fills the context length {config['search']['max_length']}",
                          "use shorter verification prompts or a larger context length", details=result)
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=2, sort_keys=True))
    print(f"onnxruntime-genai on the CPU twin: the original export's tokens ({'+'.join(map(str, compared))}) for "
          f"{len(prompts)} prompts")


def first_difference(want: list[list[int]], got: list[tuple[list[int], int]], eos: set[int]
                     ) -> tuple[list[int], tuple[int, int, int | None, int | str] | None]:
    """How many tokens of each prompt are compared, and (prompt, position, genai's id or None, the original's id or
    "EOS") where genai's greedy tokens (`got`: per prompt, its tokens and the room the context length left) first
    differ from the original export's (`want`), else None. genai ends at an EOS and does not keep it in the
    sequence (0.18.0): the original's tokens are compared up to their first EOS, where genai must have ended."""
    stops = [next((k for k, t in enumerate(w) if t in eos), None) for w in want]
    want = [w if s is None else w[:s] for w, s in zip(want, stops)]
    compared = [min(len(w), room) for w, (_, room) in zip(want, got)]
    diff = next(((i, k, toks[k] if k < len(toks) else None, w[k])
                 for i, (w, (toks, _), n) in enumerate(zip(want, got, compared))
                 for k in range(n) if k >= len(toks) or toks[k] != w[k]), None)
    return compared, diff or next(((i, s, toks[s], "EOS") for i, ((toks, room), s) in enumerate(zip(got, stops))
                                   if s is not None and s < min(room, len(toks)) and toks[s] not in eos), None)


def _decode(og: Any, twin: Path, prompts: list[Any], tokens: int, held: dict[str, int] | None = None
            ) -> list[tuple[list[int], int]]:
    """Per prompt: genai's greedy continuation (up to `tokens`, an EOS or the context length) and how many
    tokens the context length left after the prompt padded to whole windows. `held` gets the process's PSS after
    the decode, the model still open (Linux; absent elsewhere)."""
    import numpy as np

    model = og.Model(str(twin))
    out = []
    for prompt in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False)  # greedy, whatever the export's sampling options
        gen = og.Generator(model, params)
        gen.append_tokens(prompt.astype(np.int32))
        start = len(gen.get_sequence(0))  # the prompt as genai holds it: padded to whole windows
        while not gen.is_done() and len(gen.get_sequence(0)) < start + tokens:
            gen.generate_next_token()
        out.append(([int(t) for t in gen.get_sequence(0)[start:]],
                    json.loads((twin / "genai_config.json").read_text())["search"]["max_length"] - start))
        del gen
    if held is not None and (pss := proportional_set_size()) is not None:
        held["pss"] = pss
    del model
    return out
