"""OUT/manifest.json: every artifact with its recipe, target, kind, path, sha256, size and the toolchain (and the
rewrites prepare made in its model, when it made any); a model package's manifest.json with its variants."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctxbuild.atomic import read_json, write_if_changed
from ctxbuild.digests import DigestMemo
from ctxbuild.layout import STATE, record_path
from ctxbuild.outputs.search_table import search_of, with_costs
from ctxbuild.outputs.adapters import adapter_entries, alpha_summary
from ctxbuild.graph.protowire import wrapper_facts
from ctxbuild.lora.alpha import KEY as ALPHA_KEY
from ctxbuild.outputs import gate
from ctxbuild.outputs.lineage import rewrites
from ctxbuild.toolchain.runtimes import Runtime, runtime

MANIFEST_VERSION = 1
KINDS = {"ctx": "epcontext_model", "bin": "context_binary", "package": "model_package",
         "ctx_qio": "epcontext_model_quantized_io"}  # switch: alpha: the same binary's wrapper fed codes


def write(out: Path, plan_state: dict[str, Any], toolchain_versions: dict[str, str]) -> dict[str, Any]:
    """Describe what is on disk and up to date; artifacts of failed or unbuilt actions are left out. Wrappers
    carry the EP's compatibility info and, for the runtimes their recipe declares, the deploy gate's verdicts."""
    memo = DigestMemo(out / STATE / "digests.sqlite")
    searches = {a["id"]: a["candidates"] for a in plan_state["actions"] if "candidates" in a}
    by_id = {a["id"]: a for a in plan_state["actions"]}
    artifacts = []
    for art in plan_state["artifacts"]:
        path = out / art["path"]
        record = read_record(out, art["action"])
        if not path.is_file() or record is None or record.get("status") != "ok":
            continue
        role = art["role"]
        if art["target"] is None:  # a model package's manifest.json: its variants are the artifacts beside it
            artifacts.append({"recipe": art["recipe"], "target": None, "kind": KINDS[role], "path": art["path"],
                              "sha256": memo.digest(path), "size": path.stat().st_size, "toolchain": "installed",
                              "variants": _package_variants(path)})
            continue
        entry = {
            "recipe": art["recipe"], "target": art["target"], "kind": KINDS.get(role.split(":")[0], role),
            "path": art["path"], "sha256": memo.digest(path), "size": path.stat().st_size,
            "serves": _serves(art["target"]), "verification": _verification(out, art["verified_by"]),
            "toolchain": art.get("toolchain") or "installed",  # which one made it (`toolchains` below)
        }
        if art["action"] in by_id and (made := rewrites(art["action"], by_id, lambda i: read_record(out, i))):
            entry["rewrites"] = made  # prepare's legalization (docs/legalization.md): rule -> count
        if search := search_of(record):  # precision: auto: which candidate won, every candidate's figures
            entry["precision_search"] = with_costs(search, searches.get(art["action"], {}),
                                                   lambda i: read_record(out, i))
        names = record.get("graph_names", {})
        if role.startswith("ctx"):  # an EPContext model names one graph of its binary
            graph = role.split(":", 1)[1] if ":" in role else art["graphs"][0]
            entry.update(graph=graph, graph_name_in_binary=names.get(graph), compatibility=gate.facts(path))
            if alpha_map := wrapper_facts(path)["metadata"].get(ALPHA_KEY):  # switch: alpha: index <-> adapter
                entry["lora_alpha"] = alpha_summary(json.loads(alpha_map))
            if art.get("runtimes"):  # the deploy gate, for the runtimes the recipe declares
                entry["runtimes"] = [{"runtime": rt.as_dict(), **v} for rt in map(_runtime, art["runtimes"])
                                     for v in gate.judge(entry["compatibility"], entry["serves"], rt)]
        else:
            entry["graphs"] = names
            if art["twins"]:
                entry["weight_sharing"] = _sharing(out, art["twins"], entry["size"])
            elif apart := _compiled_inside(out, art["verified_by"]):  # an LLM part check's twins, not kept
                entry["weight_sharing"] = _saved(apart, entry["size"])
        artifacts.append(entry)
    adapters = adapter_entries(out, plan_state.get("adapters", []), memo, _verification)
    memo.close()
    manifest = {"version": MANIFEST_VERSION, "toolchain": toolchain_versions, "artifacts": artifacts,
                "adapters": adapters}
    if used := sorted({a["toolchain"] for a in artifacts} - {"installed"}):  # `toolchain` above is the installed one
        from ctxbuild.toolchain import choose, provision

        manifest["toolchains"] = {n: provision.provisioned(choose.by_name(n)) for n in used}
    write_if_changed(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    return manifest


def _runtime(spec: dict[str, str]) -> Runtime:
    return runtime(spec, "runtimes")  # checked with the recipe: no error here


def _serves(target: dict[str, Any]) -> list[dict[str, str]]:
    """The SoCs a binary loads on: one, or several for a multi-SoC ("flexible") binary."""
    names = target["name"].split("+")
    socs, arches = target["soc_model"].split(","), target["htp_arch"].split(",")
    if len(names) != len(socs):
        names = [target["name"]] * len(socs)
    return [{"name": n, "soc_model": s, "htp_arch": h} for n, s, h in zip(names, socs, arches)]


def _package_variants(path: Path) -> dict[str, list[str]]:
    """Component -> its variants, in the order onnxruntime breaks ties in (the package's manifest.json)."""
    components = (read_json(path) or {}).get("components", {})
    return {c: list(body.get("variants", {})) for c, body in components.items() if isinstance(body, dict)}


def _verification(out: Path, verifiers: list[str]) -> dict[str, Any] | None:
    if not verifiers:
        return None
    results = [read_record(out, v) for v in verifiers]
    if any(r is None or r.get("status") not in ("ok", "failed") for r in results):
        return {"status": "not run"}
    passed = all(r.get("status") == "ok" for r in results)  # type: ignore[union-attr]
    methods = sorted({r.get("result", {}).get("method", "?") for r in results})  # type: ignore[union-attr]
    tokens = [r["result"]["by_cl"] for r in results if "by_cl" in (r.get("result") or {})]  # type: ignore[union-attr]
    # llm_quality: perplexity and agreement per backend (the texts are in the report and llm_quality.json)
    quality = [{k: v for k, v in r["result"]["quality"].items() if k != "texts"} | {"thresholds": r["result"]["thresholds"]}
               for r in results if "quality" in (r.get("result") or {})]  # type: ignore[union-attr]
    random = any((r.get("result") or {}).get("sample_source") == "random" for r in results)  # type: ignore[union-attr]
    # on seeded random inputs a pass proves the graph runs, not that it computes the user's results
    return {"status": "failed" if not passed else "unverified (random inputs)" if random else "passed",
            "method": ", ".join(methods),
            **({"tokens_by_cl": tokens[0]} if tokens else {}),  # llm_part_eval, llm_eval: per CL and backend (docs/llm.md)
            **({"quality": quality[0]} if quality else {})}


def _sharing(out: Path, twins: list[str], bundle_size: int) -> dict[str, Any] | None:
    """Bundle .bin size against the same graphs compiled apart (the verification twins), measured."""
    sizes = {}
    for t in twins:
        r = read_record(out, t)
        if r is None or r.get("status") != "ok" or "bin" not in r.get("outputs", {}):
            return None
        sizes[t] = r["outputs"]["bin"]["size"]
    return _saved(sum(sizes.values()), bundle_size)


def _compiled_inside(out: Path, verifiers: list[str]) -> int:
    """The .bin bytes of the single-graph twins a verification compiled inside its action (llm_part_eval), 0 if none."""
    return sum((r or {}).get("twin_bin_bytes", 0) for r in map(lambda v: read_record(out, v), verifiers)
               if (r or {}).get("status") == "ok")


def _saved(separate: int, bundle_size: int) -> dict[str, Any]:
    return {"separate_bin_size": separate, "bundle_bin_size": bundle_size, "saved_bytes": separate - bundle_size}



def read_record(out: Path, action_id: str) -> dict[str, Any] | None:
    """An action's record in OUT (None if it has none)."""
    return read_json(record_path(out, action_id))


def read_records(out: Path) -> dict[str, dict[str, Any]]:
    records = {}
    for p in (out / STATE / "records").glob("*.json"):
        try:
            r = json.loads(p.read_text())
            records[r["id"]] = r
        except (OSError, ValueError, KeyError):
            continue
    return records

