"""The deploy gate: will a built wrapper load on a device with a given runtime (QAIRT, onnxruntime) and SoC, and why.

Per wrapper and SoC: "loads" (the EP would call it optimal), "loads, not optimal" (an older arch than the SoC's,
or another VTCM size: a rebuild for the SoC runs better), "will not load" (compiled by a newer QAIRT than the
runtime's, an arch newer than the SoC's, an ONNX IR version the runtime's onnxruntime cannot read, or an
ep_cache_context the EP refuses: absolute or with `..`), "unverified" (OUT's manifest gives no sha256 for it). In
OUT mode nothing outside OUT is read: a manifest path leading out of it will not load.
Used by `ctxbuild check` and by the manifest for the runtimes a recipe declares (`runtimes:`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.digests import sha256_file
from ctxbuild.errors import InspectError, UsageError
from ctxbuild.graph.protowire import wrapper_facts
from ctxbuild.qnn import compat
from ctxbuild.qnn.soccheck import binary_facts
from ctxbuild.qnn.socs import Soc
from ctxbuild.recipes import targets as soc_table
from ctxbuild.toolchain.runtimes import Runtime, fmt, parse_version

LOADS, SUBOPTIMAL, WILL_NOT_LOAD = "loads", "loads, not optimal", "will not load"
UNVERIFIED = "unverified"  # OUT's manifest gives no sha256 for a file: what is there may not be what was built
FAILING = (WILL_NOT_LOAD, UNVERIFIED)  # verdicts that fail the gate (`check` exits 1)
_VERDICT = {compat.Compatibility.OPTIMAL: LOADS, compat.Compatibility.PREFER_RECOMPILATION: SUBOPTIMAL,
            compat.Compatibility.UNSUPPORTED: WILL_NOT_LOAD}
_HTP = compat.BACKEND_HTP


def facts(wrapper: Path, f: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the gate needs from a wrapper (and what the manifest records): the EP's compatibility info (None for
    wrappers of binaries made elsewhere), the ONNX IR version, the QNN SDK build the wrapper names, and what its
    context binary's own header says (`binary`: targets, build id, backend; or `binary_error`), read as `inspect`
    reads it: the verdicts go by the binary, the wrapper's string is only a cross-check (onnxruntime-qnn 2.3.0-2.6.0
    write another arch there than they compile for: v68, or 0). `f`: the wrapper's facts, when read already."""
    f = f or wrapper_facts(wrapper)
    sdk = sorted(set(f["ep_sdk_versions"]))
    found: dict[str, Any] = {"ep_compatibility_info": f["metadata"].get(compat.METADATA_KEY),
                             "ir_version": f["ir_version"], "qnn_sdk": sdk[0] if len(sdk) == 1 else sdk or None}
    try:
        if len(f["binaries"]) != 1:
            raise InspectError(f"the wrapper names {len(f['binaries'])} context binaries; ctxbuild writes one")
        rel = f["binaries"][0]
        if problem := ep_refuses(rel):
            raise InspectError(problem)
        found["binary"] = binary_facts(wrapper.parent / rel if rel else wrapper, embedded=not rel)
    except (InspectError, OSError) as e:
        found["binary_error"] = f"cannot read its context binary: {e}"
    return found


def ep_refuses(rel: str) -> str | None:
    """Why the QNN EP refuses an EPContext node's ep_cache_context, or None: it must be relative to the wrapper and
    not climb out of its directory (an absolute path and `..` are rejected at load, QNN-NOTES.md)."""
    if rel and (Path(rel).is_absolute() or ".." in Path(rel).parts):
        return (f"its ep_cache_context {rel!r} is {'absolute' if Path(rel).is_absolute() else 'outside its directory'}"
                ": the QNN EP refuses it at load (a path relative to the wrapper, without '..')")
    return None


def _info(fact: dict[str, Any], serves: list[dict[str, str]]) -> compat.CompatInfo:
    """The binary's compatibility facts from its own header (the wrapper's string for the user-driver flag, which
    the header does not carry), or, for a record without them, the EP's string; failing both, the facts of
    a QNN SDK build id and the target: format 0, judged like V1 (arch and SDK only)."""
    wrapper = compat.parse(fact["ep_compatibility_info"]) if fact.get("ep_compatibility_info") else None
    if b := fact.get("binary"):
        sdk, api = parse_version(b.get("build_id") or ""), parse_version(b.get("backend_api_version") or "")
        if sdk is None or api is None or not b.get("targets"):
            raise ValueError(f"the context binary's header names no SDK build or target ({b})")
        archs = tuple(a for _, a in b["targets"])
        return compat.CompatInfo(2, b.get("backend_id") or _HTP, (sdk + (0, 0))[:3], (api + (0, 0))[:3], archs,
                                 tuple(s for s, _ in b["targets"]), tuple(b.get("vtcm_mb") or 0 for _ in archs),
                                 wrapper.htp_usr_drv if wrapper else False)
    if wrapper is not None:
        return wrapper
    sdk = parse_version(fact["qnn_sdk"]) if isinstance(fact["qnn_sdk"], str) else None
    if sdk is None:
        raise ValueError(f"no compatibility info and no single QNN SDK version ({fact['qnn_sdk']})")
    v = (sdk + (0, 0))[:3]
    return compat.CompatInfo(0, _HTP, v, v, tuple(int(s["htp_arch"]) for s in serves), (), (), False)


def _cross_check(fact: dict[str, Any], info: compat.CompatInfo) -> str:
    """A note when the wrapper's compatibility string disagrees with the binary it names."""
    if not fact.get("binary") or not fact.get("ep_compatibility_info"):
        return ""
    said = compat.parse(fact["ep_compatibility_info"])
    if said.htp_archs == info.htp_archs and said.sdk_version[:2] == info.sdk_version[:2]:
        return ""
    return (f" (the wrapper's compatibility info says HTP {', '.join(f'v{a}' for a in said.htp_archs)}, QAIRT "
            f"{fmt(said.sdk_version[:2])}; the binary's header, used here: "
            f"{', '.join(f'v{a}' for a in info.htp_archs)}, QAIRT {fmt(info.sdk_version[:2])})")


def _socs(info: compat.CompatInfo, serves: list[dict[str, str]], soc: Soc | None
          ) -> list[tuple[str, int, int | None]]:
    """(name, htp_arch, vtcm_mb) of each device to judge on: the SoC asked for, else those the artifact serves."""
    if soc is not None:
        return [(soc.name, soc.htp_arch, soc.vtcm_mb)]
    out = []
    for s in serves:
        known = soc_table.lookup(s.get("name", "")) or soc_table.by_soc_model(str(s.get("soc_model")))
        out.append((s.get("name") or f"soc_model {s.get('soc_model')}", int(s["htp_arch"]),
                    known.vtcm_mb if known else None))
    return out


REBUILD = "rebuild it: `ctxbuild build` into this OUT"


def judge(fact: dict[str, Any], serves: list[dict[str, str]], runtime: Runtime,
          soc: Soc | None = None) -> list[dict[str, str]]:
    """One verdict per SoC: {"soc", "verdict", "reason"}, and for "will not load" and "unverified" the `fix` (a
    recipe line where one makes a wrapper that loads)."""
    if problem := fact.get("changed") or fact.get("binary_error") or fact.get("unverified"):
        names = [soc.name] if soc else [s.get("name", "?") for s in serves] or ["?"]
        verdict = UNVERIFIED if problem == fact.get("unverified") else WILL_NOT_LOAD
        return [{"soc": n, "verdict": verdict, "reason": problem, "fix": REBUILD} for n in names]
    try:
        info = _info(fact, serves)
    except ValueError as e:
        return [{"soc": soc.name if soc else "?", "verdict": WILL_NOT_LOAD, "reason": f"cannot tell: {e}",
                 "fix": "build it with ctxbuild, or wrap its binary with `ctxbuild wrap` (both record what it needs)"}]
    if not serves and soc is None:
        serves = [{"name": f"soc_model {m}", "soc_model": str(m), "htp_arch": str(a)}
                  for m, a in zip(info.soc_models, info.htp_archs)]
    if not serves and soc is None:
        raise UsageError("the wrapper does not say which SoC it was built for", "give --soc NAME")
    note = _cross_check(fact, info)
    rows = []
    for name, arch, vtcm in _socs(info, serves, soc):
        if fact["ir_version"] > runtime.max_ir:
            ort = fmt(runtime.onnxruntime) if runtime.onnxruntime else "1.24"
            rows.append({"soc": name, "verdict": WILL_NOT_LOAD, "reason": (
                f"ONNX IR {fact['ir_version']}: onnxruntime {ort} opens IR <= {runtime.max_ir}"),
                "fix": "`ctxbuild wrap` its binary: ctxbuild's wrappers are lowered for onnxruntime 1.24"})
            continue
        own_vtcm = max(info.vtcm_mbs, default=0)
        device = compat.Device(sdk_version=(runtime.qairt + (0, 0))[:3], htp_arch=arch,
                               vtcm_mb=vtcm if vtcm is not None else own_vtcm)
        verdict, reason = compat.judge(info, device)
        rows.append({"soc": name, "verdict": _VERDICT[verdict], "reason": reason + note,
                     **({"fix": _fix(info, runtime, name)} if verdict == compat.Compatibility.UNSUPPORTED else {})})
    return rows


def _fix(info: compat.CompatInfo, runtime: Runtime, soc: str) -> str:
    """The recipe line that makes a wrapper this runtime and SoC load (compat.judge's refusals, in its order)."""
    if info.backend_id != _HTP or info.htp_usr_drv:
        return "rebuild it with ctxbuild, which compiles for the HTP without the user driver"
    if info.sdk_version[:2] > runtime.qairt[:2]:  # forward-only: a toolchain no newer than the runtime's QAIRT
        chosen = f'"{runtime.plugin}"' if runtime.plugin else f'{{qairt: "{fmt(runtime.qairt)}"}}'
        return f"build for that runtime too: `toolchain: [installed, {chosen}]` in the recipe"
    return f"build for that SoC too: add {soc} to the recipe's `targets:`"


def _ship_instead(rows: list[dict[str, Any]]) -> None:
    """A wrapper that will not load where another build of the same recipe (a toolchain variant,
    `<recipe>-qairt-X.Y.Z`, or another target) loads on the same runtime and SoC: the fix is to ship that one."""
    loads = {(r["runtime"], r["soc"], _base(r["recipe"])): r["path"] for r in rows if r["verdict"] != WILL_NOT_LOAD}
    for r in rows:
        if r["verdict"] == WILL_NOT_LOAD and (other := loads.get((r["runtime"], r["soc"], _base(r["recipe"])))):
            r["fix"] = f"ship {other} to these devices: it loads"


def _base(recipe: str) -> str:
    """A recipe's name without its toolchain variant's suffix (choose.Toolchain.suffix)."""
    return recipe.split("-qairt-", 1)[0]


def check(path: Path, runtimes: list[Runtime], soc_name: str | None) -> list[dict[str, Any]]:
    """Rows for `ctxbuild check`: every wrapper of OUT's manifest (or the one wrapper `path`) x runtime x SoC. In
    OUT every artifact is first checked against the manifest's sha256: a file changed since the build (a deleted or
    appended .bin) will not load as verified."""
    soc = None
    if soc_name is not None:
        soc = soc_table.lookup(soc_name)
        if soc is None:
            raise UsageError(f"--soc {soc_name}: unknown SoC", soc_table.suggest(soc_name))
    if path.is_dir():
        artifacts = _manifest_artifacts(path)
        expected = {a["path"]: a.get("sha256") for a in artifacts}
        arts = [(path / a["path"], a) for a in artifacts if a["kind"] == "epcontext_model"]
    elif path.is_file() and path.suffix == ".onnx":
        arts = [(path, {"path": str(path), "recipe": "-", "target": {"name": "-"}, "serves": []})]
        expected = {}
    elif path.is_file():
        raise UsageError(f"{path}: not an EPContext model or a build's output directory",
                         "give OUT or a _ctx.onnx (`ctxbuild inspect` reads a .bin)")
    else:
        raise UsageError(f"{path}: no such file or directory", "give OUT (a build's output directory) or a _ctx.onnx")
    rows = []
    for wrapper, art in arts:
        if outside := path.is_dir() and _outside(path, art["path"]):  # OUT mode never reads a file outside OUT
            fact: dict[str, Any] = {"ir_version": 0, "changed": outside}
        else:
            wf = wrapper_facts(wrapper) if wrapper.is_file() else None
            binaries = wf["binaries"] if wf else []
            # checked before its binary is read: a binary linked out of OUT is never opened
            if changed := _changed(path, art["path"], binaries, expected):
                fact = {"ir_version": wf["ir_version"] if wf else 0, "changed": changed}
            else:
                fact = facts(wrapper, wf) if wf else {"ir_version": 0, "changed": f"{art['path']} is missing"}
                if path.is_dir() and (missing := _no_digest(art["path"], binaries, expected)):
                    fact["unverified"] = missing
        for rt in runtimes:
            for v in judge(fact, art.get("serves") or [], rt, soc):
                rows.append({"path": art["path"], "recipe": art.get("recipe", "-"),
                             "target": (art.get("target") or {}).get("name", "-"), "runtime": rt.label, **v, **fact})
    _ship_instead(rows)
    return rows


def _manifest_artifacts(out: Path) -> list[dict[str, Any]]:
    import json

    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        raise UsageError(f"{out}: no readable manifest.json", "build into it first (`ctxbuild build -o OUT`), "
                         "or give one _ctx.onnx file") from None
    arts = manifest.get("artifacts") if isinstance(manifest, dict) else None
    if not isinstance(arts, list) or not all(isinstance(a, dict) and isinstance(a.get("path"), str)
                                             and isinstance(a.get("kind"), str) for a in arts):
        raise UsageError(f"{out / 'manifest.json'}: not a ctxbuild manifest (no list of artifacts with path and kind)",
                         "rebuild OUT with `ctxbuild build`")
    return arts


def _outside(out: Path, rel: str) -> str | None:
    """Why a manifest path leads out of OUT (absolute, `..`, or a symbolic link on the way), or None."""
    if Path(rel).is_absolute() or ".." in Path(rel).parts or not (out / rel).resolve().is_relative_to(out.resolve()):
        return f"{rel} leads outside {out}: the manifest names only files inside OUT; rebuild OUT"
    return None


def _no_digest(rel: str, binaries: list[str], expected: dict[str, str | None]) -> str | None:
    """The first of the wrapper and its binaries the manifest gives no sha256 for: what it holds cannot be checked."""
    for f in [rel, *(str(Path(rel).parent / b) for b in binaries if b)]:
        if not expected.get(f):
            return f"the manifest gives no sha256 for {f}: it cannot be checked against what the build made; rebuild OUT"
    return None


def _changed(out: Path, rel: str, binaries: list[str], expected: dict[str, str | None]) -> str | None:
    """Why the wrapper `rel` or the binaries it names (`binaries`, beside it) differ from what the build made, or
    None (single files given to `check` have no manifest to compare with)."""
    if not expected:
        return None
    if problem := next(filter(None, map(ep_refuses, binaries)), None):  # never followed out of OUT
        return problem
    for f in [rel, *(str(Path(rel).parent / b) for b in binaries if b)]:
        if outside := _outside(out, f):
            return outside
        if not (out / f).is_file():
            return f"{f} is missing"
        if f in expected and expected[f] and sha256_file(out / f) != expected[f]:
            return f"{f} changed since the build (its sha256 is not the manifest's): rebuild, or restore it"
    return None


def table(rows: list[dict[str, Any]]) -> str:
    """The human table: one line per wrapper x runtime x SoC, then a count."""
    ep = any("ep_verdict" in r for r in rows)  # `check` asked the EP too (outputs/epverdict.py)
    head = ("artifact", "runtime", "soc", "verdict", *(("EP says",) if ep else ()), "why")
    body = [(r["path"], r["runtime"], r["soc"], r["verdict"], *((r.get("ep_verdict") or "-",) if ep else ()),
             r["reason"] + (f"; fix: {r['fix']}" if r.get("fix") else "")) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in (head, *body)]
    bad = sum(r["verdict"] == WILL_NOT_LOAD for r in rows)
    unverified = sum(r["verdict"] == UNVERIFIED for r in rows)
    lines.append(f"{len(rows)} checked: {len(rows) - bad - unverified} load, {bad} will not load"
                 + (f", {unverified} unverified" if unverified else ""))
    return "\n".join(lines)


def blocked(manifest: dict[str, Any]) -> list[str]:
    """One line per wrapper x declared runtime x SoC the manifest says will not load."""
    return [f"{a['path']} will not load on {v['runtime']['label']} ({v['soc']}): {v['reason']}"
            + (f"; fix: {v['fix']}" if v.get("fix") else "")
            for a in manifest.get("artifacts", []) for v in a.get("runtimes", []) if v["verdict"] == WILL_NOT_LOAD]
