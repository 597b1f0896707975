"""model_package: the manifest.json of a recipe's onnxruntime model package over the variant directories
package_variant filled, written with onnxruntime's ModelPackage API and opened again with its reader.

Each variant names the QNN EP and the compatibility string its wrapper carries (the EP wrote it when compiling):
an app's `ModelPackageContext.select_component` hands it to the EP's verdict and takes the best-rated variant, the
first declared among equals. No `device` is declared: the x86 simulator offers the QNN EP on a CPU device, so a
variant for "npu" is never selected there (measured), and the EP judges only NPUs itself. The variant's onnxruntime
settings name the HTP backend (without it a session made by the package fails on x86: "Could not determine default
backend path for device") and, for a weight-shared binary, `ep.share_ep_contexts` so its graphs load it once."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ctxbuild.errors import ActionError
from ctxbuild.graph.protowire import wrapper_facts

EP = "QNNExecutionProvider"


def run(ctx: Any) -> None:
    import onnxruntime as ort

    a, p = ctx.action, ctx.action.params
    root = ctx.tmp / "package"
    pkg = ort.ModelPackage()
    pkg.set_metadata(p["name"], None, None)
    for component in dict.fromkeys(v["component"] for v in p["variants"]):
        pkg.set_component_inline(component, json.dumps({"variants": {}}))
    pkg.commit(str(root))  # variant directories resolve against the package's root: it exists from here on
    for v in p["variants"]:
        wrapper = Path(a.inputs[v["model"]])
        (root / v["variant"]).mkdir(exist_ok=True)
        shutil.copyfile(wrapper, root / v["variant"] / wrapper.name)  # what the reader checks below resolves
        facts = wrapper_facts(wrapper)
        body: dict[str, Any] = {"ep": EP, "variant_directory": v["variant"]}
        if compat := facts["metadata"].get(f"ep_compatibility_info.{EP}"):
            body["compatibility_string"] = compat
        body["additional_metadata"] = {"ctxbuild": {
            "target": v["target"], "toolchain": v["toolchain"], "qnn_sdk": next(iter(facts["ep_sdk_versions"]), None),
            "verification": _verification([Path(a.inputs[r]) for r in v["verified"]])}}
        pkg.set_variant(v["component"], v["variant"], json.dumps(body))
        ort_info: dict[str, Any] = {"model_file": wrapper.name, "provider_options": {"backend_type": "htp"}}
        if v["shares_context"]:
            ort_info["session_options"] = {"ep.share_ep_contexts": "1"}
        pkg.set_variant_executor_info_inline(v["component"], v["variant"], "ort", json.dumps(ort_info))
    pkg.commit()
    _check(ort, root, p["variants"])
    (root / "manifest.json").replace(ctx.tmp_output("package"))
    print(f"{p['name']}: {len(p['variants'])} variants of "
          f"{len({v['component'] for v in p['variants']})} component(s) in manifest.json")


def _verification(results: list[Path]) -> dict[str, Any] | None:
    """What the simulator measured for a variant (None: not verified, `verify: false` or --no-verify)."""
    if not results:
        return None
    read = [json.loads(r.read_text()) for r in results]
    metrics = [m for r in read for m in r.get("outputs", {}).values()]
    return {"passed": all(r.get("passed") for r in read), "samples": min(r.get("samples", 0) for r in read),
            "sample_source": read[0].get("sample_source"),
            "min_cosine": min((m["cosine"] for m in metrics), default=None),
            "min_snr_db": min((m["snr_db"] for m in metrics), default=None)}


def _check(ort: Any, root: Path, variants: list[dict[str, Any]]) -> None:
    """onnxruntime's reader opens what its writer wrote (strict about unknown fields), lists every variant, and
    finds each variant's model where the package says it is."""
    listed = ort.ModelPackageContext(str(root))
    opened = ort.ModelPackage.open(str(root))
    for v in variants:
        if v["variant"] not in listed.get_variant_names(v["component"]):
            raise ActionError(f"model package {root.name}: onnxruntime does not list variant {v['variant']} of "
                              f"{v['component']} in the manifest it wrote")
        info = json.loads(opened.get_variant_json(v["component"], v["variant"]))["executor_info"]["ort"]
        opened.resolve_string_ref(info["model_file"], str(root / v["variant"]), True)
