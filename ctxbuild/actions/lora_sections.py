"""lora_sections: LoRAv2 adapter sections made elsewhere (QAIRT SDK) for a prebuilt base binary, per target.

Copies each section next to the target's wrapper and writes one `qnn.lora_config` per adapter: lines
`<graph name in the binary>;<section path>`, the path relative to the wrapper's directory. Section files are
opaque here: they can be neither made nor run on this machine (see docs/bundles-and-lora.md). What can be
checked is checked: the base binary's SoC, its graph names, and its QNN SDK build against the installed
EP's (sections and base must come from the same SDK as the runtime; a mismatch is the classic cause of
on-device crashes).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ctxbuild.toolchain import installed as toolchain
from ctxbuild.plan.action import Action
from ctxbuild.errors import ActionError, InspectError
from ctxbuild.layout import STATE
from ctxbuild.actions.prebuilt import check_target


def summarize(action: Action) -> dict[str, Any]:
    return {"sections": {n: {"graphs": [line.split(";", 1)[0] for line in
                                        Path(action.outputs[f"config:{n}"]).read_text().splitlines()]}
                         for n in action.params["names"]}}


def warnings(action: Action) -> list[str]:
    """A tolerated SDK mismatch (`sdk_mismatch: warn`), shown on every build, cached or not."""
    if action.params["sdk_mismatch"] != "warn":
        return []
    from ctxbuild.qnn.contextbin import read_binary_info

    src = Path(action.inputs["bin"])
    out = Path(next(iter(action.outputs.values()))).parents[2]  # OUT/<target>/<recipe>/<file>
    build, ep = read_binary_info(str(src), path=src).get("build_id") or "unknown", toolchain.sdk_build_id(out / STATE)
    return [] if build == ep else [f"{_mismatch(build, ep, src)}; LoRAv2 sections and base may not load together"]


def run(ctx: Any) -> None:
    from ctxbuild.qnn.contextbin import read_binary_info

    a = ctx.action
    p = a.params
    src = Path(a.inputs["bin"])
    try:
        info = read_binary_info(str(src), path=src)
    except InspectError as e:
        raise ActionError(str(e)) from None
    check_target(info, p, src, a.target["name"])
    check_sdk(info.get("build_id") or "unknown", toolchain.sdk_build_id(ctx.out / STATE), src, p["sdk_mismatch"])
    graphs = [g["name"] for g in info["graphs"]]
    for name in p["names"]:
        if Path(a.inputs[f"section:{name}"]).stat().st_size == 0:  # emptied since the recipe was planned
            raise ActionError(f"{a.inputs[f'section:{name}']}: LoRAv2 section '{name}' is empty",
                              "re-export it with the QAIRT SDK")
        dst = ctx.tmp_output(f"section:{name}")
        shutil.copyfile(a.inputs[f"section:{name}"], dst)
        # the config sits beside the wrapper: the section's path relative to it resolves from the wrapper's dir
        rel = Path(a.outputs[f"section:{name}"]).relative_to(Path(a.outputs[f"config:{name}"]).parent).as_posix()
        ctx.tmp_output(f"config:{name}").write_text("".join(f"{g};{rel}\n" for g in graphs))


def _mismatch(binary_build: str, ep_build: str, src: Path) -> str:
    return (f"{src}: built with QNN SDK {binary_build}, the installed onnxruntime-qnn "
            f"{toolchain.version('onnxruntime-qnn')} runs QNN {ep_build}")


def check_sdk(binary_build: str, ep_build: str, src: Path, on_mismatch: str) -> None:
    """The base binary's SDK build must be the EP's: fail naming both (or warn, if the recipe says so)."""
    if binary_build == ep_build or on_mismatch == "warn":  # warn: see warnings()
        return
    raise ActionError(_mismatch(binary_build, ep_build, src), "rebuild the base and its sections with the SDK the EP ships, or install the "
                      "matching onnxruntime-qnn (or set prebuilt.sdk_mismatch: warn)")
