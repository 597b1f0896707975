"""prebuilt: wrap a context binary made elsewhere (QAIRT SDK, AI Hub) into EPContext models for a target."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError, InspectError
from ctxbuild.actions.compile import summarize  # noqa: F401 - the same summary hook as compile
from ctxbuild.qnn import soccheck


def run(ctx: Any) -> None:
    from ctxbuild.qnn.contextbin import read_binary_info
    from ctxbuild.qnn.wrap import wrap_binary

    a = ctx.action
    p = a.params
    src = Path(a.inputs["bin"])
    staged = ctx.tmp / "staged" / (Path(a.outputs["bin"]).name if "bin" in a.outputs else src.name)
    staged.parent.mkdir()
    shutil.copyfile(src, staged)  # the wrappers name the binary by file name: give it its final one
    try:
        info = read_binary_info(str(src), path=staged)
        check_target(info, p, src, a.target["name"])
        if len(info["graphs"]) != len(p["graphs"]):
            raise ActionError(f"{src}: the binary holds {len(info['graphs'])} graph(s), the recipe names "
                              f"{len(p['graphs'])}", "list one name per graph in prebuilt.graphs, in the binary's order")
        wrappers = wrap_binary(staged, staged.parent, embed=p["embed"], quantized_io=p["quantized_io"])
    except InspectError as e:  # named as the user gave it, not by the staged copy that was read
        raise ActionError(str(e).replace(str(staged), str(src))) from None
    roles = ["ctx"] if "ctx" in a.outputs else [f"ctx:{g}" for g in p["graphs"]]
    for role, w in zip(roles, wrappers):
        os.replace(w, ctx.tmp_output(role))
    if "bin" in a.outputs:
        os.replace(staged, ctx.tmp_output("bin"))


def check_outputs(action: Any, outputs: dict[str, Path]) -> None:
    """The hook: the binary holds the target's SoC (a multi-SoC binary made elsewhere serves each of its SoCs)."""
    soccheck.check_outputs(action, outputs, exact=False)


def check_target(info: dict[str, Any], p: dict[str, Any], src: Path, target: str) -> None:
    """A binary built for another SoC fails to load on the device: refuse it here, where it is cheap. A
    multi-SoC ("flexible") binary holds several; one of them must be the target's."""
    have = [(t.get("soc_model"), t.get("htp_arch")) for t in info.get("targets") or []]
    if not have or any((soc is None or str(soc) == p["soc_model"]) and (arch is None or str(arch) == p["htp_arch"])
                       for soc, arch in have):
        return
    shown = ", ".join(f"soc_model {soc} / HTP v{arch}" for soc, arch in have)
    raise ActionError(f"{src}: built for {shown}, target {target} is soc_model {p['soc_model']} / v{p['htp_arch']}",
                      "use the binary made for this SoC, or target the SoC it was made for")
