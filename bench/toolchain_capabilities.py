"""What each published onnxruntime-qnn release can build, measured: weight-shared bundles (several graphs in one
context binary), with which options, and multi-SoC binaries. What ctxbuild/recipes/toolchains.py (MIN_QNN_EP) and
ctxbuild/actions/bundle.py rely on and the capability table in docs/deploy.md come from this; rerun it when a
release is added.

For each release (provisioned on demand, as a build would: ~100 MB from PyPI per release the first time):
- ep: two fp16 MatMul graphs over one 256x256 weight ([16, 256] and [1, 256] inputs, as prefill and decode)
  compiled the way the bundle action does (toolchain/installed.py compile_model: sessions with
  `ep.context_enable`, `ep.context_embed_mode 0`, `ep.share_ep_contexts 1`, `ep.stop_share_ep_contexts 1` on the
  last), once per option set below, each in a fresh process of that toolchain. Recorded: does it compile; how many
  `_qnn.bin` files; how many graphs the binary holds (libQnnSystem, what `ctxbuild inspect` reads) and its QAIRT
  build id; its size against the first graph alone (the weight is 128 KiB in fp16: one copy or two); each wrapper
  loaded on the HTP simulator in that toolchain. Controls: the first graph alone, and the same graph with
  `<graph>__`-prefixed I/O mapped back by `io_name_overrides` (as the bundle action writes its wrappers), both
  run on the simulator against numpy.
- multi_soc: the first graph compiled with `soc_model 57,69` and `htp_arch 75,79` (SM8650 and SM8750): is the
  wrapper marked `is_multi_soc_ep_context`?
- recipe (--recipes): `ctxbuild build` of recipes/lm_bundle.yaml (int16) with `toolchain: "X.Y.Z"`, then
  `ctxbuild inspect` of its binary and `ctxbuild check OUT --runtime onnxruntime-qnn=X.Y.Z`.

- features (--features, or --only-features without the rest): recipes/tiny_cnn_flex.yaml (multi_soc),
  recipes/lora_mlp.yaml and tiny_cnn with compile.quantized_io built by ctxbuild with `toolchain: "X.Y.Z"`:
  `inspect` of the multi-SoC binary, every verification on the release's simulator, `ctxbuild check` per wrapper.

Usage: python bench/toolchain_capabilities.py [--releases 2.3.0 2.7.0] [--recipes] [--features] [--json FILE]
Prints the markdown tables and writes bench/results/toolchain_capabilities.json (a partial run keeps the
other measurements in it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ctxbuild.toolchain import provision  # noqa: E402 - after the path insert
from ctxbuild.toolchain.choose import Toolchain  # noqa: E402
from ctxbuild.toolchain.installed import version  # noqa: E402
from ctxbuild.recipes.toolchains import MIN_QNN_EP  # noqa: E402
from ctxbuild.toolchain.runtimes import PUBLISHED  # noqa: E402

PROVIDER = {"soc_model": "57", "htp_arch": "75", "enable_htp_fp16_precision": "1"}  # SM8650
OPTION_SETS: dict[str, dict[str, str]] = {  # extra provider options per measured way of compiling a bundle
    "session options only": {},
    "+ enable_htp_weight_sharing 1": {"enable_htp_weight_sharing": "1"},
}
GRAPHS = {"prefill": 16, "decode": 1}  # graph -> rows of its input
WIDTH = 256
WEIGHT_BYTES = WIDTH * WIDTH * 2  # fp16 in the binary


# --- in the toolchain's own process -----------------------------------------------------------------------

def _weight() -> Any:
    import numpy as np

    return np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.05


def _models(d: Path) -> dict[str, Path]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(_weight(), "w")
    out = {}
    for g, rows in GRAPHS.items():
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], g,
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, WIDTH])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, WIDTH])], [w])
        out[g] = d / g / f"{g}.onnx"
        out[g].parent.mkdir(parents=True)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), out[g])
    return out


def child_compile(d: Path, extra: dict[str, str], graphs: list[str]) -> dict[str, Any]:
    """Compile `graphs` in order into `d` as one share group (one graph alone: no sharing)."""
    from ctxbuild.toolchain.installed import compile_model

    models = _models(d / "src")
    for i, g in enumerate(graphs):
        config = {"ep.share_ep_contexts": "1"} if len(graphs) > 1 else {}
        if len(graphs) > 1 and i == len(graphs) - 1:
            config["ep.stop_share_ep_contexts"] = "1"
        try:
            compile_model(models[g], d / f"{g}_ctx.onnx", {**PROVIDER, **extra}, embed=False, cpu_fallback=False,
                          config=config)
        except Exception as e:  # noqa: BLE001 - ORT's exceptions are untyped: the message is the measurement
            return {"compiled": False, "error": f"{g}: {str(e).strip().splitlines()[0][:300]}"}
    return {"compiled": True}


def child_run(wrapper: Path, rows: int) -> dict[str, Any]:
    """Load `wrapper` on the QNN EP (no CPU fallback) and run it on the simulator against numpy (input `x`)."""
    import numpy as np
    import onnxruntime as ort

    from ctxbuild.toolchain.installed import session_options

    x = np.random.default_rng(1).standard_normal((rows, WIDTH)).astype(np.float32)
    try:
        sess = ort.InferenceSession(str(wrapper), session_options({}, cpu_fallback=False))
        (y,) = sess.run(None, {"x": x})
    except Exception as e:  # noqa: BLE001
        return {"ran": False, "error": str(e).strip().splitlines()[0][:300]}
    return {"ran": True, "max_abs_error": float(np.abs(y - x @ _weight()).max())}


def child_renamed(d: Path) -> dict[str, Any]:
    """The bundle action's I/O renaming on one graph: compiled with I/O `prefill__x`/`prefill__y`, its wrapper
    named back to `x`/`y` with the EP's `io_name_overrides` attribute (onnx name -> name in the binary)."""
    import onnx
    from onnx import helper

    from ctxbuild.toolchain.installed import compile_model

    src = _models(d / "src")["prefill"]
    model = onnx.load(src)
    for n in (*model.graph.input, *model.graph.output):
        n.name = f"prefill__{n.name}"
    model.graph.node[0].input[0], model.graph.node[0].output[0] = "prefill__x", "prefill__y"
    onnx.save(model, src)
    dst = d / "prefill_ctx.onnx"
    compile_model(src, dst, PROVIDER, embed=False, cpu_fallback=False)
    wrapper = onnx.load(dst)
    for n in (*wrapper.graph.input, *wrapper.graph.output):
        n.name = n.name.removeprefix("prefill__")
    for node in wrapper.graph.node:
        node.input[:] = [i.removeprefix("prefill__") for i in node.input]
        node.output[:] = [o.removeprefix("prefill__") for o in node.output]
        for attr in [a for a in node.attribute if a.name == "io_name_overrides"]:  # the EP's own (empty here)
            node.attribute.remove(attr)
        node.attribute.append(helper.make_attribute("io_name_overrides", "x=prefill__x;y=prefill__y;"))
    onnx.save(wrapper, dst)
    return {"compiled": True}


def child_multi_soc(d: Path) -> dict[str, Any]:
    """The first graph compiled for two SoCs at once (SM8650 and SM8750 as lists): does the release write a
    multi-SoC container (`is_multi_soc_ep_context`), or ignore the list?"""
    import onnx

    from ctxbuild.toolchain.installed import compile_model

    dst = d / "prefill_ctx.onnx"
    try:
        compile_model(_models(d / "src")["prefill"], dst, {**PROVIDER, "soc_model": "57,69", "htp_arch": "75,79"},
                      embed=False, cpu_fallback=False)
    except Exception as e:  # noqa: BLE001
        return {"compiled": False, "error": str(e).strip().splitlines()[0][:300]}
    flags = [a.i for n in onnx.load(dst).graph.node for a in n.attribute if a.name == "is_multi_soc_ep_context"]
    return {"compiled": True, "multi_soc": bool(flags and flags[0]), "bytes": (d / "prefill_ctx_qnn.bin").stat().st_size}


# --- the driver -------------------------------------------------------------------------------------------

def _env(plugin: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    if plugin == version("onnxruntime-qnn"):
        return env
    tc = Toolchain(plugin)
    provision.ensure(tc, say=print)
    return provision.env_for(tc, env)


def _in(env: dict[str, str], *args: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=900)
    lines = p.stdout.strip().splitlines()
    if p.returncode < 0:
        return {"crashed": f"killed by signal {-p.returncode}"}
    if p.returncode != 0 or not lines:
        return {"crashed": f"exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:300]}"}
    return json.loads(lines[-1])


def _binary(env: dict[str, str], path: Path) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-m", "ctxbuild.qnn.system", str(path)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=300)
    info = json.loads(p.stdout)
    return {"graphs": len(info["graphs"]), "build_id": info["build_id"], "bytes": path.stat().st_size,
            "socs": [f"{t['soc_name']} v{t['htp_arch']}" for t in info.get("targets") or []]}


def measure_ep(plugin: str, work: Path) -> dict[str, Any]:
    import onnx

    env = _env(plugin)
    single, renamed = work / "single", work / "renamed"
    _in(env, "--compile", str(single), "{}", "prefill")
    rows: dict[str, Any] = {"single_graph_bytes": (single / "prefill_ctx_qnn.bin").stat().st_size,
                            "single_graph_runs": _in(env, "--run", str(single / "prefill_ctx.onnx"), "16"),
                            "renamed_io": _in(env, "--renamed", str(renamed))}
    rows["multi_soc"] = _in(env, "--multi-soc", str(work / "multi_soc"))
    if rows["multi_soc"].get("compiled") and not rows["multi_soc"]["multi_soc"]:  # then for which SoC?
        rows["multi_soc"]["socs"] = _binary(env, work / "multi_soc" / "prefill_ctx_qnn.bin")["socs"]
    if rows["renamed_io"].get("compiled"):
        rows["renamed_io"]["runs"] = _in(env, "--run", str(renamed / "prefill_ctx.onnx"), "16")
    first_bin = None
    for name, extra in OPTION_SETS.items():
        d = work / "bundle"  # one path for every set: the EP derives graph names and bytes from it
        r = _in(env, "--compile", str(d), json.dumps(extra), *GRAPHS)
        if r.get("compiled"):
            bins = sorted(d.glob("*_qnn.bin"))
            named = {g: [a.s.decode() for n in onnx.load(d / f"{g}_ctx.onnx").graph.node for a in n.attribute
                         if a.name == "ep_cache_context"] for g in GRAPHS}
            r.update(bins=[b.name for b in bins], wrappers_name={g: v[0] if v else None for g, v in named.items()})
            if len(bins) == 1:
                r.update(_binary(env, bins[0]))
                r["weights_once"] = r["bytes"] < rows["single_graph_bytes"] + WEIGHT_BYTES // 2
                first_bin = first_bin or bins[0].read_bytes()
                r["same_bytes_as_first_set"] = bins[0].read_bytes() == first_bin
            r["simulator_loads"] = {g: _in(env, "--run", str(d / f"{g}_ctx.onnx"), str(n)) for g, n in GRAPHS.items()}
        d.rename(work / name.replace(" ", "_").replace("+", "plus"))
        rows[name] = r
    return rows


def measure_recipe(plugin: str, work: Path) -> dict[str, Any]:
    """lm_bundle built by ctxbuild with this toolchain, inspected and checked for its own runtime."""
    import onnx

    _env(plugin)  # provisioned
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(work / "cache")}  # the CLI as a user runs it
    tree = work / "recipes"
    shutil.copytree(ROOT / "recipes" / "models", tree / "models", ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    (tree / "lm_bundle.yaml").write_text((ROOT / "recipes" / "lm_bundle.yaml").read_text().replace(
        "targets: [phones]", "targets: [SM8650]") + f'toolchain: "{plugin}"\n')
    out = work / "out"
    cli = [sys.executable, "-m", "ctxbuild"]
    b = subprocess.run([*cli, "build", str(tree), "-o", str(out)], capture_output=True, text=True, env=env,
                       timeout=3600)
    r: dict[str, Any] = {"build_exit": b.returncode}
    if b.returncode != 0:
        r["error"] = (b.stderr.strip().splitlines() or [""])[-1][:300]
        return r
    bins = sorted(out.rglob("*_qnn.bin"))  # the bundle's, and its graphs' single-graph twins (verification)
    bundle_bin = next(b for b in bins if b.name == "lm_bundle_qnn.bin")
    wrappers = {w.name: [a.s.decode() for n in onnx.load(w).graph.node for a in n.attribute
                         if a.name == "ep_cache_context"] for w in bundle_bin.parent.glob("*_ctx.onnx")}
    i = subprocess.run([*cli, "inspect", "--json", str(bundle_bin)], capture_output=True, text=True, env=env,
                       timeout=300)
    info = json.loads(i.stdout)["binaries"][0]
    manifest = json.loads((out / "manifest.json").read_text())
    sharing = next(a["weight_sharing"] for a in manifest["artifacts"] if a["path"].endswith("/lm_bundle_qnn.bin"))
    c = subprocess.run([*cli, "check", str(out), "--runtime", f"onnxruntime-qnn={plugin}"], capture_output=True,
                       text=True, env=env, timeout=300)
    return {**r, "bins": [p.name for p in bins], "wrappers": wrappers, "weight_sharing": sharing, "graphs": len(info["graphs"]), "build_id": info["build_id"],
            "check_exit": c.returncode}


QIO = ("targets: [phones, laptops]", "targets: [SM8650]\ncompile:\n  quantized_io: true")  # on recipes/tiny_cnn.yaml


def _build(tree: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ctxbuild", "build", str(tree), "-o", str(out), "-k", "0"],
                          capture_output=True, text=True, env=env, timeout=3600)


def _verdicts(out: Path) -> dict[str, Any]:
    """Every verification the build ran: passed, method, worst cosine (from the records)."""
    found = {}
    for f in sorted((out / ".ctxbuild" / "records").glob("verify*.json")):
        rec = json.loads(f.read_text())
        if res := rec.get("result"):
            found[rec["id"]] = {"passed": res["passed"], "method": res.get("method"),
                                "cosine": min(o["cosine"] for o in res["outputs"].values())}
    return found


def measure_features(plugin: str, work: Path) -> dict[str, Any]:
    """multi_soc (recipes/tiny_cnn_flex.yaml), LoRA adapters (recipes/lora_mlp.yaml, SM8650) and quantized I/O
    (tiny_cnn int16 with compile.quantized_io, SM8650) built by ctxbuild with `toolchain: "X.Y.Z"`: exit, what
    `inspect` reads from the multi-SoC binary, each verification on the release's simulator, and
    `ctxbuild check` of every wrapper for the release's own runtime."""
    _env(plugin)  # provisioned
    env = {**os.environ, "CTXBUILD_CACHE_DIR": str(work / "cache")}
    env.pop("MAKEFLAGS", None)
    pin = f'toolchain: "{plugin}"\n'
    rows: dict[str, Any] = {}
    for name, recipes in (("multi_soc", {"tiny_cnn_flex.yaml": (ROOT / "recipes" / "tiny_cnn_flex.yaml").read_text()}),
                          ("lora_qio", {"lora_mlp.yaml": (ROOT / "recipes" / "lora_mlp.yaml").read_text().replace(
                              "precision: w8a16\n", "precision: w8a16\ntargets: [SM8650]\n"),
                                        "tiny_cnn_qio.yaml": (ROOT / "recipes" / "tiny_cnn.yaml").read_text().replace(*QIO)})):
        tree, out = work / name / "recipes", work / name / "out"
        shutil.copytree(ROOT / "recipes" / "models", tree / "models",
                        ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        for file, text in recipes.items():
            (tree / file).write_text(text + pin)
        b = _build(tree, out, env)
        r: dict[str, Any] = {"build_exit": b.returncode}
        if b.returncode == 2:
            r["error"] = (b.stderr.strip().splitlines() or [""])[-1][:400]
            rows[name] = r
            continue
        r["verified"] = _verdicts(out)
        wrappers = sorted(w for w in out.glob("*/*/*_ctx.onnx"))
        r["check_exit"] = {str(w.relative_to(out)): subprocess.run(
            [sys.executable, "-m", "ctxbuild", "check", str(w), "--runtime", f"onnxruntime-qnn={plugin}"],
            capture_output=True, text=True, env=env, timeout=300).returncode for w in wrappers}
        for binary in out.glob("*+*/*/*_qnn.bin"):  # the multi-SoC one
            i = subprocess.run([sys.executable, "-m", "ctxbuild", "inspect", "--json", str(binary)],
                               capture_output=True, text=True, env=env, timeout=300)
            info = json.loads(i.stdout)["binaries"][0]
            r["inspect"] = {"format": info["format"], "build_id": info["build_id"], "bytes": binary.stat().st_size,
                            "socs": [f"{t['soc_name']} v{t['htp_arch']}" for t in info["targets"]]}
        rows[name] = r
    return rows


def _verdict_cell(r: dict[str, Any], prefix: str) -> str:
    mine = {k: v for k, v in r["verified"].items() if k.split("/", 1)[1].startswith(prefix)}
    if not mine:
        return "not verified"
    ok = all(v["passed"] for v in mine.values())
    return (f"{len(mine)} verification{'s' if len(mine) > 1 else ''} {'pass' if ok else 'FAIL'} on its simulator "
            f"(cosine >= {min(v['cosine'] for v in mine.values()):.4f})")


def features_table(results: dict[str, Any]) -> str:
    """The second table in docs/deploy.md: multi-SoC, LoRA and quantized I/O recipes per release."""
    lines = ["| onnxruntime-qnn (QAIRT) | multi_soc (tiny_cnn_flex: SC8380XP + SM8750) | LoRA (lora_mlp, 3 adapters) "
             "| quantized I/O (tiny_cnn int16) |", "|---|---|---|---|"]
    for plugin, rows in results.items():
        f = rows.get("features")
        if f is None:
            continue
        ms, lq = f["multi_soc"], f["lora_qio"]
        if ms["build_exit"] == 2:
            said = ms["error"].split(": toolchain: ", 1)[-1].split(f" ({MIN_QNN_EP['multi_soc'][2]}", 1)[0]  # no hint
            ms_cell = f"refused (exit 2): {said}"
        elif ms["build_exit"]:
            ms_cell = f"build exit {ms['build_exit']}"
        else:
            i = ms["inspect"]
            checks = ms["check_exit"].values()
            ms_cell = (f"{i['format'].replace('_', '-')} binary, {i['bytes']:,} B, {', '.join(i['socs'])}, "
                       f"{i['build_id'].rsplit('.', 1)[0]}; single-SoC twin: {_verdict_cell(ms, 'tiny_cnn_flex')}; "
                       f"check exit {max(checks)}")
        cells = []
        for prefix in ("lora_mlp", "tiny_cnn_qio"):
            checks = [v for k, v in lq.get("check_exit", {}).items() if k.split("/")[1] == prefix]
            cells.append(f"build exit {lq['build_exit']}; {_verdict_cell(lq, prefix)}; check exit {max(checks)}"
                         if checks else f"build exit {lq['build_exit']}")
        lines.append(f"| {plugin} ({PUBLISHED[plugin]}) | {ms_cell} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def _outcome(r: dict[str, Any]) -> str:
    if r.get("ran"):
        return f"runs (max abs error {r['max_abs_error']:.3f})"
    why = r.get("error") or r.get("crashed") or ""
    return f"no: {next((w.rstrip(':') for w in why.split() if w.startswith('QNN_')), why)}"  # the QNN error's name, if any


def _recipe_cell(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "not run"
    if rec["build_exit"]:
        return f"build exit {rec['build_exit']}: {rec.get('error')}"
    one = all(v == ["lm_bundle_qnn.bin"] for v in rec["wrappers"].values())
    ws = rec["weight_sharing"]
    return (f"built; {rec['graphs']} graphs, {rec['build_id'].rsplit('.', 1)[0]}, {ws['bundle_bin_size']:,} B "
            f"({ws['separate_bin_size']:,} B apart){', one .bin for both wrappers' if one else ''}; "
            f"check exit {rec['check_exit']}")


def _multi_soc_cell(r: dict[str, Any]) -> str:
    if not r.get("compiled"):
        return f"fails: {r.get('error') or r.get('crashed')}"
    return (f"a multi-SoC container, {r['bytes']:,} B" if r["multi_soc"] else
            f"the list ignored: a plain binary for {', '.join(r['socs'])} only, {r['bytes']:,} B")


def table(results: dict[str, Any]) -> str:
    """The table in docs/deploy.md: one row per release."""
    plain, extra = OPTION_SETS
    lines = ["| onnxruntime-qnn (QAIRT) | two graphs, session options only | .bin files (named by both wrappers) "
             "| graphs in it, build id | bytes (prefill alone) | + `enable_htp_weight_sharing 1` "
             "| x86 simulator loads the bundle | renamed I/O (`io_name_overrides`) on the simulator "
             "| lm_bundle: build, inspect, check | one graph for SM8650 and SM8750 at once (multi_soc) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for plugin, rows in results.items():
        ep, r, x = rows["ep"], rows["ep"][plain], rows["ep"][extra]
        head = f"| {plugin} ({PUBLISHED[plugin]}) |"
        if not r.get("compiled"):
            lines.append(f"{head} no: {r.get('error') or r.get('crashed')} | | | | | | | {_recipe_cell(rows.get('recipe'))} "
                         f"| {_multi_soc_cell(ep['multi_soc'])} |")
            continue
        one = len(set(r["wrappers_name"].values())) == 1
        same = ("same bytes" if x.get("same_bytes_as_first_set") else "other bytes") if x.get("compiled") else \
            f"fails: {x.get('error') or x.get('crashed')}"
        loads = "; ".join(sorted({_outcome(v) for v in r["simulator_loads"].values()}))
        ren = ep["renamed_io"]
        lines.append(f"{head} {'yes, the weight stored once' if r.get('weights_once') else 'yes, the weight per graph'} | "
                     f"{len(r['bins'])}{' (yes)' if one else ' (no)'} | {r.get('graphs', '-')}, {r.get('build_id', '-')} "
                     f"| {r.get('bytes', 0):,} ({ep['single_graph_bytes']:,}) | {same} | {loads} | "
                     f"{_outcome(ren.get('runs', ren))} | {_recipe_cell(rows.get('recipe'))} | "
                     f"{_multi_soc_cell(ep['multi_soc'])} |")
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["--compile"]:
        print(json.dumps(child_compile(Path(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4:])))
        return 0
    if sys.argv[1:2] == ["--multi-soc"]:
        print(json.dumps(child_multi_soc(Path(sys.argv[2]))))
        return 0
    if sys.argv[1:2] == ["--renamed"]:
        print(json.dumps(child_renamed(Path(sys.argv[2]))))
        return 0
    if sys.argv[1:2] == ["--run"]:
        print(json.dumps(child_run(Path(sys.argv[2]), int(sys.argv[3]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", nargs="*", default=list(PUBLISHED))
    ap.add_argument("--recipes", action="store_true", help="also build recipes/lm_bundle.yaml with each release")
    ap.add_argument("--features", action="store_true", help="also build multi_soc, LoRA and quantized I/O recipes")
    ap.add_argument("--only-features", action="store_true", help="only the --features builds (no EP measurements)")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "toolchain_capabilities.json")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ctxbuild-capabilities-") as tmp:
        for plugin in args.releases:
            results[plugin] = {} if args.only_features else {"ep": measure_ep(plugin, Path(tmp) / plugin / "ep")}
            if args.features or args.only_features:
                results[plugin]["features"] = measure_features(plugin, Path(tmp) / plugin / "features")
            if args.recipes:
                results[plugin]["recipe"] = measure_recipe(plugin, Path(tmp) / plugin / "recipe")
            print(f"{plugin}: {json.dumps(results[plugin])}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if args.json.exists():  # a partial run (--only-features, --releases) keeps the other measurements
        old = json.loads(args.json.read_text())
        results = {p: {**old.get(p, {}), **results.get(p, {})} for p in {**old, **results}}
        results = {p: results[p] for p in PUBLISHED if p in results}
    args.json.write_text(json.dumps(results, indent=1))
    if all("ep" in rows for rows in results.values()):
        print(table(results))
    print(features_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
