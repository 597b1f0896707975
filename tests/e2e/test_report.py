"""OUT/report.json and OUT/report.html after real builds, and what a real headless Chromium renders of them.

One build of the example recipes plus three that fail for real: `broken_nz` (QNN rejects a NonZero node, so
its compile fails), `strict_int8` (it compiles, but its verify demands an SNR that int8 cannot reach) and
`corrupt` (its model is not ONNX: prepare fails, so its compile never runs).
"""
from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import onnx
import pytest

from tests._qnn_models import nonzero_model
from tests.conftest import TINY_CNN, Result, copy_examples, run_cli

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]
NZ_CAUSE = "QNN cannot run 1 node(s): find_nonzero (NonZero)"


def _cli(*args: str, cache: Path, cwd: Path) -> Result:
    return run_cli(args, cache, cwd)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, example_models: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("report")
    tree = copy_examples(root / "recipes", example_models)
    onnx.save(nonzero_model(), tree / "models" / "nz.onnx")
    (tree / "broken_nz.yaml").write_text("model: models/nz.onnx\nprecision: fp16\ntargets: [SM8650]\n")
    (tree / "strict_int8.yaml").write_text(
        TINY_CNN + "precision: w8a8\n"
        "calibration: {dir: models/calib/tiny_cnn}\ntargets: [SM8650]\nverify: {min_snr_db: 90}\n")
    (tree / "models" / "corrupt.onnx").write_bytes(b"\x08\x07garbage" * 50)
    (tree / "corrupt.yaml").write_text("model: models/corrupt.onnx\nprecision: fp16\ntargets: [SM8750]\n")
    out = root / "out"
    r = _cli("build", str(tree), "-o", str(out), "-k", "0", cache=root / "cache", cwd=root)
    assert r.code == 1, r.text
    assert NZ_CAUSE in r.err
    return {"root": root, "tree": tree, "out": out, "report": json.loads((out / "report.json").read_text())}


def _read(p: Path) -> Any:
    return json.loads(p.read_text())


def _records(out: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in map(_read, (out / ".ctxbuild" / "records").glob("*.json"))}


def _row(report: dict[str, Any], recipe: str, target: str) -> dict[str, Any]:
    [row] = [r for r in report["rows"] if r["recipe"] == recipe and r["target"]["name"] == target]
    return row


# ---- report.json ----------------------------------------------------------------------------------------

def test_report_json_describes_the_build(built: dict[str, Any]) -> None:
    out, rep = built["out"], built["report"]
    plan = _read(out / ".ctxbuild" / "plan.json")
    manifest = _read(out / "manifest.json")
    last = _read(out / ".ctxbuild" / "last_build.json")
    recs = _records(out)

    deliverables = {a["action"] for a in plan["artifacts"]}
    want = {(r, a["target"]["name"]) for a in plan["actions"] if a["id"] in deliverables for r in a["recipes"]}
    assert {(r["recipe"], r["target"]["name"]) for r in rep["rows"]} == want
    assert ("broken_nz", "SM8650") in want and ("tiny_cnn", "SC8380XP") in want

    b = rep["build"]
    assert (b["built"], b["from_cache"], b["failed"]) == (last["executed"], last["from_cache"], last["failed"])
    assert b["failed"] == 3 and b["outcome"] == "failed" and b["returncode"] == 1
    assert b["actions"] == len(plan["actions"]) and b["wall_seconds"] > 0
    assert rep["toolchain"] == manifest["toolchain"]

    # the compile failure: status, one-line cause, a relative link to a log that exists
    nz = _row(rep, "broken_nz", "SM8650")
    assert nz["status"] == "failed" and NZ_CAUSE in nz["cause"] and "\n" not in nz["cause"]
    assert nz["failed_action"] == "compile/broken_nz@SM8650" and nz["ctx_size"] is None
    assert (out / unquote(nz["href"])).is_file() and not nz["href"].startswith("/")
    assert nz["log"] == recs["compile/broken_nz@SM8650"]["log"]
    # the accuracy failure: the binary is built, its verify failed on SNR, not on cosine
    strict = _row(rep, "strict_int8", "SM8650")
    assert strict["status"] == "failed" and strict["accuracy"] is False
    # built, but set aside: a failed verification leaves nothing in the deliverable tree OUT/<target>/
    assert (out / ".ctxbuild" / "failed" / "SM8650" / "strict_int8" / "strict_int8_ctx.onnx").is_file()
    assert not (out / "SM8650" / "strict_int8" / "strict_int8_ctx.onnx").exists()
    assert strict["failed_action"] == "verify/strict_int8@SM8650" and "SNR" in strict["cause"]
    [o] = strict["verify"][0]["outputs"]
    assert o["snr_ok"] is False and o["cosine_ok"] is True
    # an upstream failure: the compile never ran, the row names the prepare that failed and links its log
    bad = _row(rep, "corrupt", "SM8750")
    assert bad["status"] == "failed" and bad["failed_action"].startswith("prepare/corrupt-")
    assert "corrupt.onnx: not a valid ONNX model" in bad["cause"] and bad["cause"].startswith("prepare corrupt")
    assert (out / unquote(bad["href"])).is_file()
    assert {f["id"] for f in rep["failures"]} == {"compile/broken_nz@SM8650", "verify/strict_int8@SM8650",
                                                  bad["failed_action"]}
    assert [f["blocks"] for f in rep["failures"] if f["id"] == bad["failed_action"]] == [["corrupt@SM8750"]]

    sizes: dict[tuple[str, str, str], int] = {}
    for art in manifest["artifacts"]:
        k = (art["recipe"], art["target"]["name"], "bin" if art["path"].endswith(".bin") else "ctx")
        sizes[k] = sizes.get(k, 0) + art["size"]
    precision = {"tiny_cnn": "w8a16", "tiny_cnn_int8": "w8a8", "mlp_fp16": "fp16", "strict_int8": "w8a8"}
    for row in rep["rows"]:
        key, rec = (row["recipe"], row["target"]["name"]), recs.get(row["action"], {})
        assert row["ctx_size"] == sizes.get((*key, "ctx")) and row["bin_size"] == sizes.get((*key, "bin"))
        assert row["compile_seconds"] == rec.get("seconds")
        if row["recipe"] in precision:
            assert row["precision"] == precision[row["recipe"]]
        if rec.get("status") == "ok":
            assert row["cache"] == {"run": "miss", "cache": "hit"}[rec["source"]]
        ws = next((a["weight_sharing"] for a in manifest["artifacts"] if a.get("weight_sharing")
                   and (a["recipe"], a["target"]["name"]) == key), None)
        if ws:  # bundles: the measured savings from the manifest
            assert row["sharing"]["saved_bytes"] == ws["saved_bytes"] > 0
        # metrics straight from the verify records, wherever they exist
        vrecs = [v for v in recs.values() if v["kind"] == "verify" and row["recipe"] in v["recipes"]
                 and v["target"]["name"] == row["target"]["name"] and isinstance(v.get("result"), dict)]
        assert len(row["verify"]) >= len(vrecs)
        for v in vrecs:
            [mine] = [x for x in row["verify"] if x["id"] == v["id"]]
            assert mine["passed"] == v["result"]["passed"]
            for o in mine["outputs"]:
                assert o["cosine"] == v["result"]["outputs"][o["name"]]["cosine"]
                assert o["snr_db"] == v["result"]["outputs"][o["name"]]["snr_db"]
        if vrecs and row["recipe"] in ("tiny_cnn", "mlp_fp16"):
            assert row["accuracy"] is True and row["coverage"]["fraction"] == 1.0 and row["status"] != "failed"

    nodes = {n["id"]: n for n in rep["graph"]["nodes"]}
    assert set(nodes) == {a["id"] for a in plan["actions"]}
    assert nodes["compile/broken_nz@SM8650"]["status"] == "failed"
    assert nodes["compile/corrupt@SM8750"]["status"] == "not built"
    for a in plan["actions"]:  # layered: every edge goes from a lower layer to a higher one
        for d in a["deps"]:
            assert nodes[d]["layer"] < nodes[a["id"]]["layer"]
            assert nodes[d]["x"] < nodes[a["id"]]["x"]


def test_report_html_is_self_contained(built: dict[str, Any]) -> None:
    text = (built["out"] / "report.html").read_text()
    assert '<meta name="viewport"' in text and "<svg" in text
    assert "<script" not in text and "<link" not in text and "@import" not in text
    assert not [u for u in re.findall(r"(?:https?:)?//[\w.-]+[^\s\"')]*", text) if "www.w3.org/2000/svg" not in u]


# ---- what Chromium shows ----------------------------------------------------------------------------------

def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")


def _browse(chromium: str, tmp: Path, *args: str) -> str:
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp)
    p = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


# Appended to a copy of report.html: what the browser laid out and coloured, as JSON in <pre id="probe">.
# (The report itself has no script; this is the test's measuring tape.)
PROBE = """<script>
(function(){
 function all(s){return Array.prototype.slice.call(document.querySelectorAll(s));}
 function q(s){return document.querySelector(s);}
 var failed=all('tbody.row[data-status="failed"]');
 var svg=q('svg.graph').getBoundingClientRect();
 var facts={innerWidth:innerWidth, scrollWidth:document.documentElement.scrollWidth,
  thead:getComputedStyle(q('table.results thead')).display,
  rows:all('tbody.row').map(function(t){var r=t.getBoundingClientRect();
   return {recipe:t.dataset.recipe,target:t.dataset.target,status:t.dataset.status,
    left:r.left,right:r.right,h:r.height};}),
  failed:failed.map(function(t){var b=t.querySelector('.badge'),c=t.querySelector('.cause'),a=t.querySelector('a.log');
   return {recipe:t.dataset.recipe,badgeBg:getComputedStyle(b).backgroundColor,badgeFg:getComputedStyle(b).color,
    badge:b.textContent,cause:c?c.textContent:null,causeFg:c?getComputedStyle(c).color:null,
    border:getComputedStyle(t).borderLeftColor,cell:getComputedStyle(t.querySelector('td')).boxShadow,
    log:a?a.getAttribute('href'):null,logVisible:a?a.getBoundingClientRect().width>0:false};}),
  metricFail:all('.m-fail').map(function(e){return [e.textContent,getComputedStyle(e).color];}),
  metricPass:all('.m-pass').map(function(e){return getComputedStyle(e).color;}),
  summary:q('#summary').textContent.replace(/\\s+/g,' ').trim(),
  plots:all('svg.plot').map(function(e){var r=e.getBoundingClientRect();
   return {id:e.parentNode.id||e.parentNode.className,w:r.width,h:r.height,bars:e.querySelectorAll('rect').length,
    red:all.call(null,'#'+(e.parentNode.id||'none')+' rect').filter(function(x){
     return getComputedStyle(x).fill.indexOf('179, 38, 30')>=0;}).length};}),
  memoryOpen:q('details.memory')?q('details.memory').open:null,
  memoryHeight:q('#memory')?q('#memory').getBoundingClientRect().height:null,
  note:q('#simulator-note')?q('#simulator-note').textContent.replace(/\\s+/g,' '):null,
  files:all('a.file').map(function(a){return a.getAttribute('href');}),
  svg:{w:svg.width,h:svg.height,nodes:all('svg.graph g.node').length,
   failedStroke:all('svg.graph g.n-failed rect').map(function(e){return getComputedStyle(e).stroke;})}};
 var s=JSON.stringify(facts);
 if(window.parent!==window){parent.postMessage(s,'*');}
 var pre=document.createElement('pre');pre.id='probe';pre.textContent=s;document.body.appendChild(pre);
})();
</script>"""

PHONE = """<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0">
<iframe src="{src}" style="display:block;border:0;width:390px;height:{h}px"></iframe><pre id="probe"></pre>
<script>addEventListener('message',function(e){{document.getElementById('probe').textContent=e.data;}});</script>
</body></html>"""


def _probe(dom: str) -> dict[str, Any]:
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert m and m.group(1), dom[-2000:]
    return json.loads(html.unescape(m.group(1)))


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(float(x)) for x in re.findall(r"[\d.]+", css)[:3])


def _reddish(css: str) -> bool:
    r, g, b = _rgb(css)
    return r > 150 and r > g + 60 and r > b + 60


def _greenish(css: str) -> bool:
    r, g, b = _rgb(css)
    return g > r + 40 and g > b + 20


def _png_size(p: Path) -> tuple[int, int]:
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, p
    return struct.unpack(">II", data[16:24])


def test_report_in_headless_chromium(built: dict[str, Any], tmp_path: Path) -> None:
    chromium = _chromium()
    out, rep = built["out"], built["report"]
    # the per-layer diagnosis of the graph that fails verification: the report draws its worst nodes
    r = _cli("verify", "--layers", "strict_int8", str(built["tree"]), "-o", str(out), cache=built["root"] / "cache",
             cwd=built["root"])
    assert r.code == 1 and (out / "SM8650" / "strict_int8" / "strict_int8_layers.json").is_file(), r.err
    rep = _read(out / "report.json")  # rewritten by that run (its build verified strict_int8 again)
    b = rep["build"]
    expected_rows = {(r["recipe"], r["target"]["name"]) for r in rep["rows"]}
    summary = f"{b['built']} built, {b['from_cache']} from cache, {b['failed']} failed"

    # 1. the report as is (no script in it): what the browser parsed
    dom = _browse(chromium, tmp_path, "--window-size=1280,900", "--dump-dom", (out / "report.html").as_uri())
    rows = set(re.findall(r'<tbody class="row st-\w+" data-recipe="([^"]+)" data-target="([^"]+)"', dom))
    assert rows == expected_rows
    assert summary in re.sub(r"<[^>]+>", "", dom)
    assert re.search(r'<tbody class="row st-failed" data-recipe="broken_nz" data-target="SM8650" '
                     r'data-status="failed">', dom)
    assert NZ_CAUSE in dom and "<svg" in dom
    for href in re.findall(r'<a class="log" href="([^"]+)"', dom):
        assert (out / unquote(html.unescape(href))).is_file(), href

    # 2. desktop: measured and coloured by the browser
    shutil.copy(out / "report.html", out / "probe.html")
    (out / "probe.html").write_text((out / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    desk = _probe(_browse(chromium, tmp_path, "--window-size=1280,900", "--dump-dom", (out / "probe.html").as_uri()))
    assert {(r["recipe"], r["target"]) for r in desk["rows"]} == expected_rows
    assert all(r["h"] > 0 and r["right"] > r["left"] for r in desk["rows"])
    assert desk["thead"] != "none" and desk["scrollWidth"] <= desk["innerWidth"]  # the table scrolls, not the page
    assert summary in desk["summary"]
    failed = {f["recipe"]: f for f in desk["failed"]}
    assert set(failed) == {"broken_nz", "strict_int8", "corrupt"}
    for f in failed.values():
        assert f["badge"] == "failed" and _reddish(f["badgeFg"]) and _reddish(f["causeFg"])
        assert f["logVisible"] and (out / unquote(f["log"])).is_file()
        assert _reddish(f["cell"])  # the red bar on the row's left edge
    assert NZ_CAUSE in failed["broken_nz"]["cause"]
    assert "SNR" in failed["strict_int8"]["cause"]
    assert any(t.startswith("SNR") and _reddish(c) for t, c in desk["metricFail"])  # the metric that failed
    assert any(t == "FAIL" and _reddish(c) for t, c in desk["metricFail"])
    assert desk["metricPass"] and all(_greenish(c) for c in desk["metricPass"])
    assert desk["svg"]["nodes"] == len(rep["graph"]["nodes"]) and desk["svg"]["w"] > 200 and desk["svg"]["h"] > 50
    assert desk["svg"]["failedStroke"] and all(_reddish(c) for c in desk["svg"]["failedStroke"])
    # plots drawn by the server as SVG: accuracy per output against the thresholds (strict_int8's bar red),
    # .bin size per SoC, the failed graph's per-layer loss; all visible
    plots = {p["id"]: p for p in desk["plots"]}
    verified = sum(len(v["outputs"]) for row in rep["rows"] for v in row["verify"] if v["outputs"])
    assert plots["plot-accuracy"]["bars"] >= verified and plots["plot-accuracy"]["red"] >= 1
    assert plots["plot-bins"]["bars"] == sum(1 for row in rep["rows"] if row["bin_size"])
    assert "layer-plot" in plots and plots["layer-plot"]["bars"] >= 2
    assert all(p["w"] > 200 and p["h"] > 20 for p in desk["plots"])
    assert desk["memoryOpen"] is False and desk["memoryHeight"] < 90  # collapsed: a heading and one summary line
    assert "measures accuracy, not latency" in desk["note"]
    assert desk["files"] and all((out / unquote(f)).is_file() for f in desk["files"])  # links to the artifacts
    assert any(f.endswith("_ctx.onnx") for f in desk["files"]) and any(f.endswith(".bin") for f in desk["files"])

    # 3. a 390 px phone (an iframe: headless windows are at least 500 px wide): cards, nothing wider than the screen
    (out / "phone_probe.html").write_text(PHONE.format(src="probe.html", h=844))
    phone = _probe(_browse(chromium, tmp_path, "--window-size=390,844", "--virtual-time-budget=3000", "--dump-dom",
                           (out / "phone_probe.html").as_uri()))
    assert phone["innerWidth"] == 390 and phone["scrollWidth"] <= 390
    assert phone["thead"] == "none"
    assert {(r["recipe"], r["target"]) for r in phone["rows"]} == expected_rows
    assert all(0 <= r["left"] and r["right"] <= 390 and r["h"] > 0 for r in phone["rows"])
    assert all(_reddish(f["border"]) and _reddish(f["badgeFg"]) for f in phone["failed"])
    assert NZ_CAUSE in {f["recipe"]: f for f in phone["failed"]}["broken_nz"]["cause"]

    # 4. screenshots (look at them: tmp_path/report-wide.png, tmp_path/report-phone.png)
    wide = tmp_path / "report-wide.png"
    _browse(chromium, tmp_path, "--window-size=1280,1600", f"--screenshot={wide}", (out / "report.html").as_uri())
    assert _png_size(wide) == (1280, 1600)
    (out / "phone.html").write_text(PHONE.format(src="report.html", h=2400))
    narrow = tmp_path / "report-phone.png"
    _browse(chromium, tmp_path, "--window-size=390,2400", f"--screenshot={narrow}", (out / "phone.html").as_uri())
    assert _png_size(narrow) == (390, 2400)


# ---- every build rewrites it; a dry run does not --------------------------------------------------------------

def test_noop_build_rewrites_report_dry_run_does_not(built: dict[str, Any]) -> None:
    out, root = built["out"], built["root"]
    r = _cli("build", str(built["tree"]), "-o", str(out), "-k", "0", cache=root / "cache", cwd=root)
    assert r.code == 1
    rep = _read(out / "report.json")
    b = rep["build"]
    # strict_int8's compile is restored by key: its failed verification (the --layers run before) set it aside
    assert b["built"] == 0 and b["from_cache"] == 1
    assert b["failed"] == 3  # ninja retries the failed edges, and they fail the same way
    assert b["up_to_date"] == b["actions"] - 4 - b["not_built"]
    assert _row(rep, "tiny_cnn", "SM8650")["this_build"] is False
    assert _row(rep, "tiny_cnn", "SM8650")["status"] in ("ok", "from cache")
    assert NZ_CAUSE in _row(rep, "broken_nz", "SM8650")["cause"]
    assert "0 built, 1 from cache, 3 failed" in re.sub(r"<[^>]+>", "", (out / "report.html").read_text())
    before = (out / "report.json").read_bytes(), (out / "report.html").stat().st_mtime_ns
    r = _cli("build", str(built["tree"]), "-o", str(out), "--dry-run", cache=root / "cache", cwd=root)
    assert r.code == 0, r.err
    assert ((out / "report.json").read_bytes(), (out / "report.html").stat().st_mtime_ns) == before


def test_search_plot_marks_winner_and_threshold() -> None:
    """The precision search's picture: one point per candidate (SNR against .bin size), the min SNR a line."""
    from ctxbuild.outputs import plots

    search = {"winner": "w8a16", "thresholds": {"min_snr_db": 20},
              "candidates": [{"name": "w8a8", "passed": False, "bin_size": 40_000, "outputs": {"y": {"snr_db": 12.5}}},
                             {"name": "w8a16", "passed": True, "winner": True, "bin_size": 65_000,
                              "outputs": {"y": {"snr_db": 34.0}}},
                             {"name": "fp16", "passed": True, "bin_size": 130_000, "outputs": {"y": {"snr_db": 60.0}}}]}
    svg = plots.search(search)
    assert svg.count("<circle") == 3 and svg.count('stroke="#000"') == 1  # the winner ringed
    assert "min 20 dB" in svg and "w8a8: SNR 12.5 dB" in svg
    cy = {m[0]: float(m[1]) for m in re.findall(r"<title>(\w+): SNR [^<]*</title><circle cx=\"[\d.]+\" cy=\"([\d.]+)\"", svg)}
    assert cy["w8a8"] > cy["w8a16"] > cy["fp16"]  # higher SNR drawn higher
    assert plots.search({"candidates": []}) is None
    assert "&lt;b&gt;" in plots.hbars([{"label": "<b>", "value": 1.0, "ok": True}], unit="dB", label="x")  # escaped
    many = plots.hbars([{"label": f"g{i}", "value": float(i), "ok": None} for i in range(100)], unit="dB", label="x")
    assert many.count("<rect") == plots.MAX_BARS and "and 60 more" in many  # a 100-target build stays readable


SEARCH_PROBE = """<script>
(function(){
 var t=document.querySelector('table.candidates');
 var head=Array.prototype.map.call(t.querySelectorAll('thead th'),function(th){
  var r=th.getBoundingClientRect();return {text:th.textContent,left:Math.round(r.left)};});
 var rows=Array.prototype.map.call(t.querySelectorAll(':scope > tbody > tr'),function(tr){
  return Array.prototype.map.call(tr.children,function(td){
   var r=td.getBoundingClientRect();return {left:Math.round(r.left),display:getComputedStyle(td).display};});});
 var pre=document.createElement('pre');pre.id='probe';pre.textContent=JSON.stringify({head:head,rows:rows});
 document.body.appendChild(pre);
})();
</script>"""


def test_search_table_lines_up_in_chromium(built: dict[str, Any], tmp_path: Path) -> None:
    """Every candidate row's cells sit under their headers, rows with a note or a refusal included (a `.sub`
    cell once took `display: block` and pushed the timings under the wrong headers)."""
    from ctxbuild.outputs.report_html import render_html

    chromium = _chromium()
    report = _read(built["out"] / "report.json")
    metrics = {"y": {"cosine": 0.99, "snr_db": 30.0}}
    costs = {"quantize": 1.0, "compile": 2.0, "verify": 3.0}
    report["rows"][0]["search"] = {
        "winner": "w8a16", "thresholds": {"min_cosine": 0.99, "min_snr_db": 20}, "skipped": [],
        "candidates": [
            {"name": "w8a8", "passed": False, "winner": False, "outputs": {}, "bin_size": None, "failures": [],
             "compile_refused": None, "note": "rejected on the CPU: cosine 0.5", "state": "rejected_cpu",
             "seconds": costs},
            {"name": "a16w4", "passed": False, "winner": False, "outputs": {}, "bin_size": None, "failures": [],
             "compile_refused": {"error": "QNN cannot run 1 node(s)", "hint": None}, "note": None, "state": None,
             "seconds": costs},
            {"name": "w8a16", "passed": True, "winner": True, "outputs": metrics, "bin_size": 1024, "failures": [],
             "compile_refused": None, "note": None, "state": None, "seconds": costs}]}
    page = tmp_path / "search.html"
    page.write_text(render_html(report).replace("</body>", SEARCH_PROBE + "</body>"))
    facts = _probe(_browse(chromium, tmp_path, "--window-size=1400,900", "--dump-dom", page.as_uri()))
    header = [h["left"] for h in facts["head"]]
    assert [h["text"] for h in facts["head"]][-3:] == ["quantize", "compile", "verify"]
    assert len(facts["rows"]) == 3
    for cells in facts["rows"]:
        assert all(c["display"] == "table-cell" for c in cells)
        assert [c["left"] for c in cells][-3:] == header[-3:]  # the timings under their headers
        assert cells[0]["left"] == header[0] and cells[2]["left"] == header[2]
