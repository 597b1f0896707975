"""The deploy gate: will a built wrapper load on a device with a given runtime (QAIRT, onnxruntime) and SoC, and why.

Per wrapper and SoC: "loads" (the EP would call it optimal), "loads, not optimal" (an older arch than the SoC's,
or another VTCM size: a rebuild for the SoC runs better), "will not load" (compiled by a newer QAIRT than the
runtime's, an arch newer than the SoC's, or an ONNX IR version the runtime's onnxruntime cannot read).
Used by `ctxbuild check` and by the manifest for the runtimes a recipe declares (`runtimes:`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxbuild.errors import UsageError
from ctxbuild.graph.protowire import wrapper_facts
from ctxbuild.qnn import compat
from ctxbuild.qnn.socs import Soc
from ctxbuild.recipes import targets as soc_table
from ctxbuild.toolchain.runtimes import Runtime, fmt, parse_version

LOADS, SUBOPTIMAL, WILL_NOT_LOAD = "loads", "loads, not optimal", "will not load"
_VERDICT = {compat.Compatibility.OPTIMAL: LOADS, compat.Compatibility.PREFER_RECOMPILATION: SUBOPTIMAL,
            compat.Compatibility.UNSUPPORTED: WILL_NOT_LOAD}
_HTP = compat.BACKEND_HTP


def facts(wrapper: Path) -> dict[str, Any]:
    """What the gate needs from a wrapper (and what the manifest records): the EP's compatibility info (None for
    wrappers of binaries made elsewhere), the ONNX IR version and the QNN SDK build that compiled its binary."""
    f = wrapper_facts(wrapper)
    sdk = sorted(set(f["ep_sdk_versions"]))
    return {"ep_compatibility_info": f["metadata"].get(compat.METADATA_KEY), "ir_version": f["ir_version"],
            "qnn_sdk": sdk[0] if len(sdk) == 1 else sdk or None}


def _info(fact: dict[str, Any], serves: list[dict[str, str]]) -> compat.CompatInfo:
    """The EP's compatibility info, or (a wrapper ctxbuild wrote around a binary made elsewhere) the same facts
    from the binary's QNN SDK build id and the target: format 0, judged like V1 (arch and SDK only)."""
    if fact["ep_compatibility_info"]:
        return compat.parse(fact["ep_compatibility_info"])
    sdk = parse_version(fact["qnn_sdk"]) if isinstance(fact["qnn_sdk"], str) else None
    if sdk is None:
        raise ValueError(f"no compatibility info and no single QNN SDK version ({fact['qnn_sdk']})")
    v = (sdk + (0, 0))[:3]
    return compat.CompatInfo(0, _HTP, v, v, tuple(int(s["htp_arch"]) for s in serves), (), (), False)


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


def judge(fact: dict[str, Any], serves: list[dict[str, str]], runtime: Runtime,
          soc: Soc | None = None) -> list[dict[str, str]]:
    """One verdict per SoC: {"soc", "verdict", "reason"}."""
    try:
        info = _info(fact, serves)
    except ValueError as e:
        return [{"soc": soc.name if soc else "?", "verdict": WILL_NOT_LOAD, "reason": f"cannot tell: {e}"}]
    if not serves and soc is None:
        serves = [{"name": f"soc_model {m}", "soc_model": str(m), "htp_arch": str(a)}
                  for m, a in zip(info.soc_models, info.htp_archs)]
    if not serves and soc is None:
        raise UsageError("the wrapper does not say which SoC it was built for", "give --soc NAME")
    rows = []
    for name, arch, vtcm in _socs(info, serves, soc):
        if fact["ir_version"] > runtime.max_ir:
            ort = fmt(runtime.onnxruntime) if runtime.onnxruntime else "1.24"
            rows.append({"soc": name, "verdict": WILL_NOT_LOAD, "reason": (
                f"ONNX IR {fact['ir_version']}: onnxruntime {ort} opens IR <= {runtime.max_ir}")})
            continue
        own_vtcm = max(info.vtcm_mbs, default=0)
        device = compat.Device(sdk_version=(runtime.qairt + (0, 0))[:3], htp_arch=arch,
                               vtcm_mb=vtcm if vtcm is not None else own_vtcm)
        verdict, reason = compat.judge(info, device)
        rows.append({"soc": name, "verdict": _VERDICT[verdict], "reason": reason})
    return rows


def check(path: Path, runtimes: list[Runtime], soc_name: str | None) -> list[dict[str, Any]]:
    """Rows for `ctxbuild check`: every wrapper of OUT's manifest (or the one wrapper `path`) x runtime x SoC."""
    import json

    soc = None
    if soc_name is not None:
        soc = soc_table.lookup(soc_name)
        if soc is None:
            raise UsageError(f"--soc {soc_name}: unknown SoC", soc_table.suggest(soc_name))
    if path.is_dir():
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except (OSError, ValueError):
            raise UsageError(f"{path}: no readable manifest.json", "build into it first (`ctxbuild build -o OUT`), "
                             "or give one _ctx.onnx file") from None
        arts = [(path / a["path"], a) for a in manifest["artifacts"] if a["kind"] == "epcontext_model"]
    elif path.is_file():
        arts = [(path, {"path": str(path), "recipe": "-", "target": {"name": "-"}, "serves": []})]
    else:
        raise UsageError(f"{path}: no such file or directory", "give OUT (a build's output directory) or a _ctx.onnx")
    rows = []
    for wrapper, art in arts:
        fact = facts(wrapper)
        for rt in runtimes:
            for v in judge(fact, art.get("serves") or [], rt, soc):
                rows.append({"path": art["path"], "recipe": art["recipe"], "target": art["target"]["name"],
                             "runtime": rt.label, **v, **fact})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The human table: one line per wrapper x runtime x SoC, then a count."""
    head = ("artifact", "runtime", "soc", "verdict", "why")
    body = [(r["path"], r["runtime"], r["soc"], r["verdict"], r["reason"]) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in (head, *body)]
    bad = sum(r["verdict"] == WILL_NOT_LOAD for r in rows)
    lines.append(f"{len(rows)} checked: {len(rows) - bad} load, {bad} will not load")
    return "\n".join(lines)


def blocked(manifest: dict[str, Any]) -> list[str]:
    """One line per wrapper x declared runtime x SoC the manifest says will not load."""
    return [f"{a['path']} will not load on {v['runtime']['label']} ({v['soc']}): {v['reason']}"
            for a in manifest.get("artifacts", []) for v in a.get("runtimes", []) if v["verdict"] == WILL_NOT_LOAD]
