"""The action key, whole: a digest over everything that decides an action's outputs and nothing else.

Components: the kind, its parameters, the digests of its declared and discovered inputs (`discover`: the files its
kind's hook finds at run time, memoized), its outputs' names,
the toolchain's fingerprint (ctxbuild's action schema, onnx, onnxruntime; onnxruntime-qnn and the QNN SDK build
id for kinds that use QNN) and the kind's own `key_extras`. The runner, the farm and the driver's toolchain check
all key through here; docs/caching.md says why each component is in it."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ctxbuild import settings
from ctxbuild.atomic import write_bytes
from ctxbuild.digests import DigestMemo, canonical_json
from ctxbuild.layout import memo_dir
from ctxbuild.userfiles import checked, roots_for
from ctxbuild.plan import kinds
from ctxbuild.plan.action import Action
from ctxbuild.toolchain import installed

# Bump when an action's outputs change for the same inputs (new parameters, different layout...).
ACTION_SCHEMA_VERSION = 20  # 2: verify checks output slices; 3: models carry <model>.data, compiled from staging.fixed_dir;
# 4: wrappers lowered to the lowest IR and the opsets their nodes use (qnn/lower.py); 5: prepare legalizes ops
# the HTP does not run (graph/legalize/); precision-search candidates are gated (verify/gates.py), a refused
# candidate's compile status lists the refused nodes; 6: llm_quantize keeps weights at int8 by pattern (keep_8bit);
# prepare's rules rmsnorm, gelu, mask_fill (added within 5: caches hold prepares without them), quantize writes
# fused RMSNorms out again; 7: llm_package writes the genai pipeline's mask and KV stages beside genai_config.json,
# llm_split streams each graph's weights (the tied LM head now folded after the cut); 8: the last part no longer
# carries the tied embedding beside its folded head; 9: a precision search's CPU screen measures output slices,
# a candidate's verify stops early on an output slice too; 10: a search's later targets skip the candidates an
# earlier target measured failing (select rows name `predicted_by`, `disagrees`); 11: llm_split records each
# part's calls for the per-part checks (llm_part_eval), which compile the twins inside; 12: llm_split keeps the
# original's tokens for llm_genai (layout.json), which no longer loads the original export; 13: prepare records the
# user's node names it changed (graph/nodenames.py), quantize keeps a fused RMSNorm pinned at fp16 fused; 14: prepare
# records unnamed nodes (by first output) and the tensors it changed, a compile refusal names the user's nodes; the
# mixed rung's culprits on the HTP are the worst nodes until what the others add leaves the output clear; 15: the
# mixed rung keeps nodes in fp16, not at 16-bit weights, where a 16-bit-weights candidate failed on the HTP only;
# 16: prepare records the user's names of tensors it renamed (the diagnosis' tensor field), the LLM static graphs
# the export's names of the nodes and the cut's tensors they renamed; 17: quantize keeps the range of a graph output
# a Relu or Clip alone reads (it took the op's, clamping at 0); the mixed rung's loss is quantization's where the
# base passes on the CPU by less than the screen's margin; a QDQ model records the recipe's overrides (QNN's refusal
# names them); 18: the mixed rung pins a lone fp16 node's neighbour with it (culprits' `widened`); 19: llm_quantize
# gives each past KV input the range of every graph's calls (a prompt graph's was a window's empty cache); 20: its
# rewritten weights go to the data file (as int32_data they stayed inline: 1.9 GB graph files at the 1B shape)


def fingerprint(kind: str, out_state: Path, toolchain: str | None = None) -> dict[str, Any]:
    """The toolchain part of an action key. Kinds that use QNN also depend on the QNN compiler. `toolchain`:
    the provisioned toolchain the action runs in (its spec's), None for the installed one."""
    site = installed.site_of(toolchain)
    fp: dict[str, Any] = {"ctxbuild_action_schema": ACTION_SCHEMA_VERSION, "onnx": installed.version("onnx"),
                          "onnxruntime": installed.version("onnxruntime", site)}
    if kinds.get(kind).uses_qnn:
        fp["onnxruntime-qnn"] = installed.version("onnxruntime-qnn", site)
        fp["qnn_sdk"] = installed.sdk_build_id(out_state, toolchain)
    if override := settings.TOOLCHAIN_OVERRIDE.get():  # for tests only: pose as another toolchain
        fp.update(override)
    return fp


def components(action: Action, discovered: dict[str, Path], memo: DigestMemo, state: Path) -> dict[str, Any]:
    """Everything that decides the outputs, and nothing else (no temp paths, no times, no OUT path)."""
    return {
        "kind": action.kind,
        "params": action.params,
        # read through userfiles.checked: confinement and file type as the files are now (issue 46)
        "inputs": {role: memo.digest(checked(Path(p), roots_for(action.confine, role)))
                   for role, p in sorted(action.inputs.items())},
        "discovered_inputs": {name: memo.digest(checked(p, roots_for(action.confine, name)))
                              for name, p in sorted(discovered.items())},
        "outputs": sorted(Path(p).name for p in action.outputs.values()),
        "toolchain": fingerprint(action.kind, state, action.toolchain),
        **({"extras": extras} if (extras := kinds.get(action.kind).hook("key_extras")(action)) else {}),
    }


def discover(action: Action, memo: DigestMemo) -> dict[str, Path]:
    """The files `action` reads beyond its declared inputs (its kind's discover_inputs hook). prepare and verify
    find a model's external data (and samples) by parsing it (importing onnx, ~0.1 s): a pure function of the
    model's bytes and place, the action's params and the listing of the directories it watches (kinds:
    discovery_follows), so it is memoized in the user cache by those: a restore into a fresh OUT parses nothing."""
    hook = kinds.get(action.kind).hook("discover_inputs")
    if (role := kinds.get(action.kind).discovery_follows) is None:
        return hook(action)
    model = Path(action.inputs[role])
    listing = [[d, sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(d) if e.is_file())]
               for d in action.watch if os.path.isdir(d)]
    try:
        key = hashlib.sha256(canonical_json([memo.digest(model), action.params, listing])).hexdigest()
    except OSError:  # the model is missing: the hook says so in its own words
        return hook(action)
    memo_file = memo_dir("discovered-2") / f"{key}.json"
    try:
        return {name: (model.parent / rel).resolve() for name, rel in json.loads(memo_file.read_bytes()).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    found = hook(action)
    try:
        write_bytes(memo_file, json.dumps({k: os.path.relpath(p, model.parent) for k, p in found.items()}).encode(),
                    durable=False)
    except OSError:
        pass
    return found


def digest(components: dict[str, Any]) -> str:
    """The action key: sha256 over the components' canonical JSON."""
    return hashlib.sha256(canonical_json(components)).hexdigest()


def why(previous: dict[str, Any] | None, record: dict[str, Any]) -> str:
    """Which key components changed since the previous record of this action in this OUT, with detail."""
    if not previous or "key_detail" not in previous:
        return "no earlier build in this output directory"
    old, new = previous["key_detail"], record["key_detail"]
    changed = [k for k in new if old.get(k) != new[k]]
    if not changed:
        return "key unchanged (outputs missing or older than their inputs)"
    return "changed: " + ", ".join(change_note(k, old.get(k), new[k]) for k in changed)


def change_note(component: str, old: Any, new: Any) -> str:
    """`toolchain (onnxruntime-qnn 2.7.0 -> 9.9.9)`, `inputs (model)`, `params (provider_options.vtcm_mb)`."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return component
    if component == "toolchain":
        parts = [f"{t} {old.get(t, 'none')} -> {new.get(t, 'none')}" for t in sorted({*old, *new})
                 if old.get(t) != new.get(t)]
    else:
        parts = _changed_paths(old, new)
    return f"{component} ({', '.join(parts[:6])}{', ...' if len(parts) > 6 else ''})" if parts else component


def _changed_paths(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k in sorted({*old, *new}):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changed_paths(a, b, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}" + (" added" if a is None else " removed" if b is None else ""))
    return out
