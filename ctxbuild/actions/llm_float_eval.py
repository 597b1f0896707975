"""llm_float_eval: the float export's side of an `llm:` recipe's quality figures (ctxbuild/llm/quality.py), once per
export, text and prompts: shared by every target, precision and part split that reads the same (its key holds
neither). The evaluation text tokenized (the recipe's `llm.eval.text`, else the text ctxbuild ships; without a
tokenizer.json, the prompts' own token ids), its perplexity on the original export (CPU EP), and the export's greedy
continuation of each verification prompt, as ids and text. The segments' and prompts' ids are kept in the result:
the actions after it read them from there, not from the text."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ctxbuild.actions.llm_split import export_files, readable
from ctxbuild.errors import ActionError
from ctxbuild.llm import quality
from ctxbuild.llm.prompts import load_prompts, prompt_files, tokenizer_of
from ctxbuild.plan.action import Action


def discover_inputs(action: Action) -> dict[str, Path]:
    return {**export_files(Path(action.inputs["model"])), **prompt_files(Path(action.watch[0]), action.params["prompts"])}


def summarize(action: Action) -> dict[str, Any]:
    r = json.loads(Path(action.outputs["result"]).read_text())
    return {"float_ppl": r["ppl"], "eval_tokens": r["text"]["tokens"]}


def run(ctx: Any) -> None:
    from ctxbuild.llm.pipeline import open_export, reference_generate

    a, p = ctx.action, ctx.action.params
    # as llm_split reads it: external data linked out of the model's directory (a Hugging Face cache) is copied
    model = readable(Path(a.inputs["model"]), ctx.tmp / "source")
    tok = Path(a.inputs["tokenizer"]) if "tokenizer" in a.inputs else None
    prompts = load_prompts(prompt_files(Path(a.watch[0]), p["prompts"]), p["prompts"], tokenizer_of(a))
    if tok is not None:
        from tokenizers import Tokenizer

        ids = np.array(Tokenizer.from_file(str(tok)).encode(Path(a.inputs["text"]).read_text(encoding="utf-8")).ids,
                       np.int64)
        source = p["text"]
    else:  # a tiny export with no tokenizer: its prompts are all the text there is
        ids, source = np.concatenate(prompts), "the verification prompts' token ids (no tokenizer.json to read a text)"
    segs = quality.segments(ids, p["segment"], p.get("max_segments"))
    if not segs:
        raise ActionError(f"the evaluation text tokenizes to {len(ids)} token(s); perplexity needs 2 or more",
                          "give llm.eval.text a longer text")
    opened = open_export(model)  # one InferenceSession for the text and every prompt
    nlls = quality.export_nll(model, segs, opened)
    result: dict[str, Any] = {
        "text": {"source": source, "tokens": int(sum(len(s) for s in segs)), "segment": p["segment"],
                 "segments": [s.tolist() for s in segs]},
        "ppl": round(quality.perplexity(nlls), 4), "by_segment": [quality.summary(x) for x in nlls],
        "first_nll": nlls[0].tolist(), "prompts": []}  # per token: the simulator's subset is the first windows
    for prompt in prompts:
        n = min(p["tokens"], p["segment"] - len(prompt))  # the static graphs decode within one context length
        if n < 1:
            raise ActionError(f"a verification prompt of {len(prompt)} tokens leaves no room to generate within "
                              f"context length {p['segment']}", "use shorter prompts or a larger context length")
        got = reference_generate(model, prompt, n, opened=opened).tokens
        result["prompts"].append({"ids": prompt.tolist(), "prompt": quality.decode(tok, prompt.tolist()),
                                  "tokens": got, "text": quality.decode(tok, got)})
    Path(ctx.tmp_output("result")).write_text(json.dumps(result, indent=1))
