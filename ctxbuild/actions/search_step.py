"""search_step: one gate of a precision search (verify/gates.py). Walks the ladder over the results known
so far (verify/ladder.py) and writes whether a candidate is still needed:

- `need`: by any target (the candidate's shared quantize and CPU screen run if so);
- `admit`: on one target, after its CPU screen (the candidate's compile and simulator verify run if so).

It reads JSON only and takes milliseconds; its key holds the thresholds and the figures, its output only the
decision, so the heavy actions behind the gate keep their keys when a threshold moves."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.verify import gates
from ctxbuild.verify.ladder import state_of, walk


def known(inputs: dict[str, str], prefix: str, names: list[str]) -> dict[str, Any]:
    """name -> result JSON for the results among `inputs` (roles `<prefix><name>`)."""
    return {n: json.loads(Path(inputs[prefix + n]).read_text()) for n in names if prefix + n in inputs}


def run(ctx: Any) -> None:
    a = ctx.action
    p = a.params
    states, whys = [], []
    for target, ladder in p["ladders"].items():
        siblings = {s: known(a.inputs, f"verify.{s}.", ladder) for s in p["siblings"].get(target, [])}
        rows = walk(ladder, known(a.inputs, "screen.", ladder), known(a.inputs, f"verify.{target}.", ladder),
                    p["thresholds"], p["predict"], siblings)
        states.append(state_of(rows, p["candidate"]) if p["candidate"] in ladder else "not_run")
        whys += [f"{target}: {r['why']}" for r in rows if r["name"] == p["candidate"] and r.get("why")]
    run_it = any(s == "pending" for s in states)
    print(f"{a.id}: {'needed' if run_it else 'not needed'} ({', '.join(states)})")
    if not run_it:  # the record says why the candidate's gate closed
        ctx.facts["why_closed"] = whys
    ctx.tmp_output("gate").write_text(gates.content(run_it))
