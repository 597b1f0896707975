"""precision: auto's mixed rung: when every quantization candidate fails, the per-node diagnosis names the nodes
to keep at higher precision (quantization.nodes), the mixed candidate is verified like any other, and the
search's answer is printed as recipe lines that pin it (restored from the cache)."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import yaml

from tests._qnn_models import conv_sigmoid_conv
from tests._sliced_model import BOXES, SCORES, write_tree
from tests.conftest import assert_pin_rebuilds_from_cache, records
from ctxbuild.verify.culprits import node_overrides
from ctxbuild.recipes.quantization import settings

RECIPE = ("model: det.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\nprecision: auto\n"
          "quantization: [{activations: uint8}]\nauto: {fp16: false}\n")


def test_a_failing_slice_is_recovered_by_a_mixed_candidate_and_the_answer_pins(tmp_path: Path, ctxbuild) -> None:
    """One uint8 scale over boxes (0-320) and scores (0-1) loses the score slice; the diagnosis sees whole
    tensors pass, so the mixed rung keeps the output's Concat in float (fp16 on the HTP): the slice recovers."""
    tree = write_tree(tmp_path / "recipes", {})
    (tree / "det.yaml").write_text(RECIPE)
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    s = json.loads((out / "SM8650" / "det" / "det_search.json").read_text())
    first, mixed = s["candidates"]
    # the CPU screen already measures the score slice far below (early stop): never compiled, still diagnosed
    assert first["state"] == "rejected_cpu" and "slice 4:10 (scores_flat)" in first["note"], first
    assert (mixed["name"], mixed["state"], s["winner"]) == ("mixed", "passed", "mixed")
    assert mixed["base"] == first["name"] and mixed["blamed"] == ["head_concat"]
    assert mixed["quantization"] == {**first["quantization"], "nodes": {"head_concat": "fp16"}}
    scores = next(x for x in first["cpu_screen"]["detections"]["slices"] if x["slice"] == "scores_flat")
    assert mixed["worst"]["snr_db"] > 40 > 20 > scores["snr_db"]
    nodes = {n.name for n in onnx.load(str(tree / "det.onnx")).graph.node}
    assert set(mixed["blamed"]) <= nodes  # names the user's model has

    # the summary prints the recipe lines; pasted, they build the same binary and restore compile and verify
    head = next(i for i, ln in enumerate(r.out.splitlines()) if "the search's answer keeps head_concat" in ln)
    lines = r.out.splitlines()[head + 1:]
    pinned = yaml.safe_load("\n".join(ln[4:] for ln in lines[:next(i for i, ln in enumerate(lines)
                                                                      if not ln.startswith("    "))]))
    assert pinned == yaml.safe_load(s["pin"]) == {
        "precision": "auto", "quantization": [{"activations": "uint8", "nodes": {"head_concat": "fp16"}}],
        "auto": {"mixed": False, "fp16": False}}
    html = (out / "report.html").read_text()
    assert "the answer keeps head_concat at higher precision" in html and "head_concat: fp16" in html
    # building again runs nothing and prints the same answer, from the stored search (a user's second look)
    answer = [ln for ln in r.out.splitlines() if "the search's answer" in ln or ln.startswith("    ")]
    again = ctxbuild("build", str(tree), "-o", str(out))
    assert again.code == 0 and "up to date" in again.out, again.text
    assert [ln for ln in again.out.splitlines() if "the search's answer" in ln or ln.startswith("    ")] == answer
    # --json carries the answer too: on a no-op, and from a fresh OUT that restores the search from the cache
    for o in (out, tmp_path / "restored"):
        doc = json.loads(ctxbuild("build", str(tree), "-o", str(o), "--json").out)
        assert doc["ok"] and doc["pins"] == [{"recipe": "det", "targets": ["SM8650"], "nodes": ["head_concat"],
                                              "pin": s["pin"]}], doc
    (tree / "det.yaml").write_text("model: det.onnx\ncalibration: {dir: cal}\ntargets: [SM8650]\n" + s["pin"])
    out2 = tmp_path / "out2"
    assert_pin_rebuilds_from_cache(ctxbuild, tree, out2)
    assert (out2 / "SM8650" / "det" / "det_ctx_qnn.bin").read_bytes() == (
        out / "SM8650" / "det" / "det_ctx_qnn.bin").read_bytes()


def test_mixed_rung_costs_nothing_when_a_candidate_passes(tmp_path: Path, ctxbuild) -> None:
    tree = write_tree(tmp_path / "recipes", {})
    (tree / "det.yaml").write_text(RECIPE.replace("{activations: uint8}", "{}"))
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out))
    assert r.code == 0, r.text
    s = json.loads((out / "SM8650" / "det" / "det_search.json").read_text())
    assert [(c["name"], c["state"]) for c in s["candidates"]] == [("w8a16", "passed"), ("mixed", "not_run")]
    assert json.loads((out / ".ctxbuild" / "work" / "search-cpu" / "det" / "mixed" / "culprits.json").read_text()) == {
        "run": False}
    assert "to pin it" not in r.out
    recs = records(out)
    assert recs["compile/det.mixed@SM8650"]["seconds"] < 2  # a placeholder behind a closed gate


def test_nodes_field_keeps_a_node_in_fp16_and_names_are_checked(tmp_path: Path, ctxbuild) -> None:
    tree = write_tree(tmp_path / "recipes", {
        "kept": "quantization: {nodes: {head_concat: fp16}}\nverify: {slices: {detections: {axis: 1, sizes: [4, 6]}}}\n",
        "typo": "quantization: {nodes: {head_conact: fp16}}\nverify: false\n"})
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "-k", "0")
    assert r.code == 2, r.text  # the only failure is the recipe's mistake
    recs = records(out)
    assert recs["verify/kept@SM8650"]["result"]["passed"] is True  # int8 with the output Concat in float
    cause = recs[next(k for k in recs if k.startswith("quantize/") and recs[k]["status"] == "failed")]["cause"]
    assert "quantization.nodes: 'head_conact' is not a node of the model" in cause and "head_concat" in cause
    (tree / "bad.yaml").write_text("model: det.onnx\nprecision: w8a8\ncalibration: {dir: cal}\ntargets: [SM8650]\n"
                                   "quantization: {nodes: {head_concat: fp32}}\n")
    r = ctxbuild("plan", str(tree / "bad.yaml"))
    assert r.code == 2 and "bad.yaml:5" in r.err, r.err


def _diagnosis(where: str, worst: list[dict], slices: list[dict] | None = None, cpu_snr_db: float = 45.0) -> dict:
    side = {"cosine": 0.9999, "snr_db": 45.0, **({"slices": slices} if slices else {})}
    return {"where": where, "thresholds": {"min_cosine": 0.99, "min_snr_db": 20.0},
            "outputs": {"y": {"quantization": {**side, "snr_db": cpu_snr_db}, "htp": side}},
            "worst_htp" if where == "htp" else "worst_quantization": worst,
            "htp_noise_added": sum(10 ** (r["htp_added_db"] / 10) for r in worst)}


def _row(node: str, added: float, weights: float | None = None, fused: tuple[str, ...] = ()) -> dict:
    return {"node": node, "op_type": "Conv", "fused": list(fused), "weight_snr_db": weights,
            "htp_added_db": added, "quant_added_db": added}


def test_culprits_from_the_diagnosis() -> None:
    base = {**settings({"activations": "uint16"}), "nodes": {"keep": {"weights": "int16"}}}
    # HTP-only loss: the worst nodes in fp16 until the others' noise clears 20 + 2.5 dB, a fused group whole
    d = _diagnosis("htp", [_row("sig", -3.0, fused=("mul",)), _row("conv", -11.0, 40.0), _row("tail", -14.0),
                           _row("quiet", -30.0)])
    assert node_overrides(d, base, {}, int16_weights=True, margin_db=2.5) == {
        "conv": "fp16", "keep": {"weights": "int16"}, "mul": "fp16", "sig": "fp16", "tail": "fp16"}
    # quantization loss: 16-bit weights where there are weights and the target runs them, else fp16
    d = _diagnosis("quantization", [_row("conv", -8.0, 25.0), _row("exp", -9.0)])
    assert node_overrides(d, base, {}, int16_weights=True, margin_db=2.5) == {
        "conv": {"weights": "int16"}, "exp": "fp16", "keep": {"weights": "int16"}}
    assert node_overrides(d, base, {}, int16_weights=False, margin_db=2.5)["conv"] == "fp16"
    # nothing near the thresholds and no weak slice: nothing to change
    assert node_overrides(_diagnosis("htp", [_row("a", -40.0)]), base, {"y": "cat"}, int16_weights=True, margin_db=2.5) == base["nodes"]
    # a weak slice in a passing output: the node computing the output
    weak = [{"slice": "scores", "cosine": 0.7, "snr_db": 1.5, "start": BOXES, "stop": BOXES + SCORES}]
    assert node_overrides(_diagnosis("htp", [_row("a", -40.0)], weak), base, {"y": "cat"}, int16_weights=True, margin_db=2.5)[
        "cat"] == "fp16"


def test_htp_culprits_are_the_nodes_whose_noise_together_fails_the_output() -> None:
    """PP-OCR's detector at w8a16-pc (the diagnosis' figures, 2 samples): the CPU reads 26.8 dB, the simulator
    19.7 dB; no node adds noise above -20 dB alone. Worst first, until what the others add fits beside the
    CPU's noise within 20 + 2.5 dB: the Sigmoid (its noise is mostly its input's, amplified) and the bias Add
    that makes that input noisy on the HTP (alone in fp16: 24.8 dB on the simulator)."""
    from ctxbuild.verify.culprits import blamed_on_htp

    rows = [_row("p2o.Sigmoid.0", -21.09), _row("p2o.Add.278", -27.73), _row("p2o.ConvTranspose.2", -28.3, 47.5),
            _row("p2o.Conv.48", -32.11, 45.1), _row("p2o.Add.280", -36.97), _row("p2o.Add.18", -40.85)]
    d = _diagnosis("htp", rows, cpu_snr_db=26.79)
    d["htp_noise_added"] += 0.00016  # the nodes past the rows shown (12 more measured on the HTP, -47 to -79 dB)
    assert [r["node"] for r in blamed_on_htp(d, 2.5)] == ["p2o.Sigmoid.0", "p2o.Add.278"]
    base = settings({"activations": "uint16", "per_channel": True})
    assert node_overrides(d, base, {}, int16_weights=True, margin_db=2.5) == {
        "p2o.Add.278": "fp16", "p2o.Sigmoid.0": "fp16"}
    # a wider margin leaves the rest less room: more nodes
    assert len(blamed_on_htp(d, 6.0)) > 2
    # the CPU's own noise leaves no room: every node, at most 8
    assert blamed_on_htp(_diagnosis("htp", rows, cpu_snr_db=21.0), 2.5) == rows
    assert len(blamed_on_htp(_diagnosis("htp", [_row(f"n{i}", -20.0) for i in range(12)]), 2.5)) == 8
    # the HTP adds little: nothing to blame
    assert blamed_on_htp(_diagnosis("htp", [_row("a", -40.0), _row("b", -41.0)], cpu_snr_db=26.79), 2.5) == []


def test_an_htp_only_loss_is_said_in_one_line_with_the_nodes_and_the_field() -> None:
    """The base's QDQ model passes on the CPU and fails on the simulator: the growing rounds (CPU) cannot help,
    so one line names the figures, the nodes the diagnosis blames on the HTP (full names, worst first) and the
    field that pins them; the search table and the no-winner hint carry it."""
    from ctxbuild.actions.select import no_winner, table
    from ctxbuild.verify.culprits import htp_only

    d = _diagnosis("htp", [_row("/model.22/dfl/conv/Conv", -3.0), _row("/model.22/Sigmoid", -9.0),
                           _row("/model.0/conv/Conv", -45.0)])
    d["outputs"]["y"]["total"] = {"cosine": 0.56, "snr_db": 1.5}
    line = htp_only(d, "w8a16", 2.5)  # the set the mixed candidate pins: not the quiet /model.0 node
    assert line == ("the loss is on the HTP only (w8a16's QDQ model on the CPU 45.0 dB at output 'y', on the "
                    "simulator 1.5 dB at output 'y'): the mixed rung's rounds measure on the CPU and cannot grow "
                    "for it; the diagnosis blames /model.22/dfl/conv/Conv, /model.22/Sigmoid: pin them in float "
                    "with quantization.nodes ({/model.22/dfl/conv/Conv: fp16, ...})")
    # the base's runs over every verification sample, where known, are the figures quoted: the diagnosis' few
    # samples can read both sides above the thresholds while the whole run failed
    whole = htp_only(d, "w8a16", 2.5, {"outputs": {"y": {"cosine": 0.9999, "snr_db": 44.2}}},
                     {"outputs": {"y": {"cosine": 0.98, "snr_db": 17.3}}})
    assert "on the CPU 44.2 dB at output 'y', on the simulator 17.3 dB at output 'y'" in whole, whole
    assert htp_only(_diagnosis("quantization", [_row("a", -3.0)]), "w8a16", 2.5) is None  # the rounds' case
    rows = [{"name": "mixed", "passed": False, "failures": ["SNR"], "bin_size": 1, "htp_only": line,
             "worst": {"cosine": 0.56, "snr_db": 1.5, "where": "output 'y'"}}]
    search = {"thresholds": {"min_cosine": 0.99, "min_snr_db": 20.0}, "winner": None, "candidates": rows,
              "skipped": []}
    assert table(search).splitlines()[-1].strip() == line
    assert no_winner("SM8650", search).hint.startswith(line + "; or ")


def _chain(convs: int) -> onnx.ModelProto:
    """x -> Conv -> Relu -> Conv -> Relu ... -> y: weighted and weightless nodes in topological order."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    nodes, inits, t = [], [], "x"
    for i in range(convs):
        inits.append(numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [t, f"w{i}"], [f"c{i}"], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        t = f"r{i}"
    nodes.append(helper.make_node("Identity", [t], ["y"], name="out"))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 2, 2]) for n in ("x", "y")]
    return helper.make_model(helper.make_graph(nodes, "chain", [io[0]], [io[1]], inits))


def test_the_set_grows_from_the_input_side_until_the_cpu_clears() -> None:
    """Rounds after the diagnosis' culprits keep the first quarter, half, then all of the bound (half the
    model's weighted nodes) of the output's ancestors at 16-bit weights, and stop at the first round whose CPU
    figures clear the thresholds by the screen's margin."""
    from ctxbuild.verify.grow import grow

    model, thr = _chain(16), {"min_cosine": 0.99, "min_snr_db": 20.0}
    seen: list[dict] = []

    def measure(snr_of: dict) -> dict:
        seen.append(snr_of)
        # the noise comes from the first convolutions: each one at 16-bit weights gains 2.5 dB
        snr = 10.0 + 2.5 * sum(1 for n in snr_of if n in {f"conv{i}" for i in range(6)})
        return {"outputs": {"y": {"snr_db": snr, "cosine": 0.9999}}}

    nodes, rounds, short = grow(model, {"out": "fp16"}, {"y"}, True, measure, thr, 2.5)
    assert short is None
    assert [(r["round"], len(r["added"]), r["int16_weights"], r["fp16"], r["snr_db"]) for r in rounds] == [
        (1, 1, 0, 1, 10.0), (2, 2, 2, 1, 15.0), (3, 2, 4, 1, 20.0), (4, 4, 8, 1, 25.0)]
    assert rounds[1]["added"] == ["conv0", "conv1"] and rounds[0]["added"] == ["out"]
    assert nodes == {"out": "fp16", **{f"conv{i}": {"weights": "int16"} for i in range(8)}} == seen[-1]
    # nothing clears within the bound: the best round is the answer, and the line says why it stopped
    nodes, rounds, short = grow(model, {}, {"y"}, True, measure, {**thr, "min_snr_db": 40.0}, 2.5)
    assert len(nodes) == 8 and len(rounds) == 4
    assert short is not None and "8 of 16" in short and "at 25.0 dB" in short, short
    # 8-bit activations (or no 16-bit weights on the target): every node is a candidate, in fp16
    nodes, rounds, _ = grow(model, {}, {"y"}, False, measure, {**thr, "min_snr_db": 40.0}, 2.5)
    assert set(nodes.values()) == {"fp16"} and len(nodes) == 16 and list(nodes)[:2] == ["conv0", "conv1"]
    assert rounds[1]["added"] == ["conv0", "relu0", "conv1", "relu1"] and rounds[-1]["fp16"] == 16


def test_16_bit_weights_that_fail_on_the_htp_only_are_no_fix_for_the_mixed_rung() -> None:
    """The layout detector's case (measured, docs/measured.md): w16a16 passes on the CPU (31.4 dB) and its
    early-stopped simulator run proves at most 14.1 dB, so the mixed rung keeps nodes in fp16, not at 16-bit
    weights. A 16-bit-weights candidate failing on the CPU too, or passing on the HTP, says nothing of the kind."""
    from ctxbuild.verify.predict import int16_weights_fail_on_htp

    thr = {"min_cosine": 0.99, "min_snr_db": 20.0}
    settings = {"w8a16-pc": {"weights": "uint8"}, "w16a16": {"weights": "int16"}}
    screens = {"w8a16-pc": {"outputs": {"y": {"snr_db": 18.8, "cosine": 0.993}}},
               "w16a16": {"outputs": {"y": {"snr_db": 31.4, "cosine": 0.9993}}}}
    stopped = {"outputs": {"y": {"snr_db": 8.5, "cosine": 0.95}},
               "early_stop": {"bounds": [{"output": "y", "snr_db": 14.1}], "of": 4}}
    pc_failed = {"outputs": {"y": {"snr_db": 18.6, "cosine": 0.992}}}
    why = int16_weights_fail_on_htp({"w8a16-pc": pc_failed, "w16a16": stopped}, screens, settings, thr)
    assert why == ("w16a16's QDQ model passes on the CPU (31.4 dB at output 'y') and reads at most 14.1 dB on the "
                   "HTP: 16-bit weights are no fix here, the kept nodes run in fp16")
    # only an 8-bit-weights candidate failed on the HTP: nothing said about 16-bit weights
    assert int16_weights_fail_on_htp({"w8a16-pc": pc_failed}, screens, settings, thr) is None
    # the 16-bit-weights candidate fails on the CPU as well: quantization's loss, 16-bit weights may still help
    cpu_short = {**screens, "w16a16": {"outputs": {"y": {"snr_db": 17.0, "cosine": 0.99}}}}
    assert int16_weights_fail_on_htp({"w16a16": stopped}, cpu_short, settings, thr) is None
    # it passes on the HTP (a loss the HTP makes, but not past the threshold)
    passing = {"outputs": {"y": {"snr_db": 22.4, "cosine": 0.998}}}
    assert int16_weights_fail_on_htp({"w16a16": passing}, screens, settings, thr) is None


def test_a_lone_fp16_pin_takes_a_neighbour_so_the_mixed_candidate_changes_what_ships(tmp_path: Path) -> None:
    """The mixed rung blaming a weightless node between quantized ones ({s: fp16}, a Sigmoid between two Convs) made
    a candidate whose QDQ model was the base's to the byte (the quantizer still puts Q/DQ around it; QNN runs it as a
    quantized op): a verify measured the base again and the printed answer changed nothing (only warned). The rung
    now pins it with the neighbour the diagnosis rates worst (else the node computing its input), so the tensor
    between them stays float; quantized for real, the pins change the QDQ model."""
    import numpy as np

    from ctxbuild.actions.quantize import quantize_model
    from ctxbuild.verify.culprits import htp_only
    from ctxbuild.verify.islands import lone_pins, runs_quantized, widen_lone

    model = conv_sigmoid_conv()
    assert lone_pins(model, {"s": "fp16"}) == ["s"]
    assert lone_pins(model, {"s": "fp16", "c2": "fp16"}) == lone_pins(model, {"c1": "fp16"}) == []  # side by side; a weight
    assert widen_lone(model, {"s": "fp16"}, [_row("s", -3.0), _row("c2", -9.0), _row("c1", -20.0)], "htp_added_db") == (
        {"c2": "fp16", "s": "fp16"}, {"s": "c2"})
    assert widen_lone(model, {"s": "fp16"}, [], "htp_added_db") == ({"c1": "fp16", "s": "fp16"}, {"s": "c1"})
    assert widen_lone(model, {"c1": "fp16"}, [], "htp_added_db") == ({"c1": "fp16"}, {})
    d = _diagnosis("htp", [_row("s", -3.0)], cpu_snr_db=45.0)
    assert "the diagnosis blames s, c1: pin them in float" in htp_only(d, "w8a8", 2.5, widened={"s": "c1"})

    # the prediction is the quantizer's: alone the pin leaves the QDQ model as it was, with its neighbour it does not
    onnx.save(model, tmp_path / "csc.onnx")
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(2)]
    qdq = {}
    for label, nodes in (("none", {}), ("lone", {"s": "fp16"}), ("widened", {"s": "fp16", "c1": "fp16"})):
        dst = tmp_path / label / "q.onnx"
        dst.parent.mkdir()
        quantize_model(tmp_path / "csc.onnx", dst, settings({"activations": "uint8", "nodes": nodes}), samples, "csc.yaml")
        qdq[label] = onnx.load(str(dst), load_external_data=False)
    assert runs_quantized(qdq["lone"], {"s": ["s"]}) == ["s"]
    assert runs_quantized(qdq["widened"], {"s": ["s"], "c1": ["c1"]}) == []
    ops = {k: sorted(n.op_type for n in m.graph.node) for k, m in qdq.items()}
    assert ops["lone"] == ops["none"] != ops["widened"]


def test_a_search_without_its_last_rungs_says_which_to_turn_back_on() -> None:
    """`auto: {mixed: false, fp16: false}` and nothing passes: the hint said only "remove `auto: {fp16: false}`"
    (the mixed rung, which recovers a failing slice, was left unsaid). It names the rungs the recipe left out."""
    from ctxbuild.actions.select import no_winner

    thr = {"min_cosine": 0.99, "min_snr_db": 20.0}
    row = {"name": "w8a8", "passed": False, "note": "skipped: CPU screen 1.3 dB", "state": "rejected_cpu"}
    mixed = {"name": "mixed", "precision": "mixed", "passed": False, "note": "not run", "state": "not_run"}
    fp16 = {"name": "fp16", "precision": "fp16", "passed": False, "note": "not run", "state": "not_run"}
    for rows, said in (([row], "remove `auto: {mixed: false, fp16: false}` to let the search try the mixed and fp16 "
                                "rungs; or "),
                       ([row, fp16], "remove `auto: {mixed: false}` to let the search try the mixed rung; or "),
                       ([row, mixed], "remove `auto: {fp16: false}` to let the search try fp16; or ")):
        hint = no_winner("SM8650", {"thresholds": thr, "candidates": rows, "winner": None, "skipped": []}).hint
        assert hint.startswith(said), hint
