"""The report's pictures as inline SVG, drawn here (no JavaScript, nothing fetched): accuracy per output and
slice against the thresholds, a precision search's candidates (SNR against .bin size), .bin size per SoC,
per-layer loss of a diagnosed graph. Each function returns SVG markup with its text escaped."""
from __future__ import annotations

from html import escape
from typing import Any

from ctxbuild.units import fmt_size as format_size

ROW_H = 18
MAX_BARS = 40  # a 100-target build would draw thousands: the worst ones, and how many are left out
LABEL_W = 260
BAR_W = 360
PASS, FAIL, NEUTRAL, LIMIT = "#1b7f3b", "#b3261e", "#1d5fb4", "#8a5a00"


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">' + "".join(body) + "</svg>")


def hbars(rows: list[dict[str, Any]], *, unit: str, label: str, fmt: Any = None) -> str:
    """Horizontal bars. rows: {label, value, limit (a threshold tick, or None), ok (colour: True/False/None),
    title}. The scale starts at 0 and ends past the largest value or limit."""
    fmt = fmt or (lambda v: f"{v:.1f} {unit}")
    rows, more = rows[:MAX_BARS], len(rows) - MAX_BARS
    top = max([r["value"] for r in rows] + [r.get("limit") or 0 for r in rows] + [1e-9]) * 1.08
    body = []
    for i, r in enumerate(rows):
        y = 4 + i * ROW_H
        w = max(1.0, BAR_W * max(r["value"], 0) / top)
        colour = NEUTRAL if r.get("ok") is None else PASS if r["ok"] else FAIL
        body.append(f'<g><title>{escape(r.get("title") or r["label"])}</title>'
                    f'<text x="{LABEL_W - 6}" y="{y + 12}" text-anchor="end">{escape(_fit(r["label"]))}</text>'
                    f'<rect x="{LABEL_W}" y="{y + 2}" width="{w:.1f}" height="{ROW_H - 5}" fill="{colour}" '
                    f'fill-opacity="0.8"/>'
                    f'<text x="{LABEL_W + w + 4:.1f}" y="{y + 12}">{escape(fmt(r["value"]))}</text></g>')
        if r.get("limit") is not None:
            x = LABEL_W + BAR_W * r["limit"] / top
            body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + ROW_H}" stroke="{LIMIT}" '
                        f'stroke-width="2"><title>threshold {escape(fmt(r["limit"]))}</title></line>')
    if more > 0:
        body.append(f'<text x="{LABEL_W}" y="{4 + len(rows) * ROW_H + 12}">… and {more} more (report.json has all)</text>')
    return _svg(LABEL_W + BAR_W + 90, 8 + (len(rows) + (more > 0)) * ROW_H, body, label)


def _fit(label: str, n: int = 36) -> str:
    """About 36 monospace characters fit left of the bars: keep the end (the target, the output)."""
    return label if len(label) <= n else "…" + label[-(n - 1):]


def accuracy(rows: list[dict[str, Any]]) -> str | None:
    """SNR per verified output (and per slice of a concatenated one) per graph and target, with the
    recipe's min SNR as a tick: the failing bar is the one to read."""
    bars = []
    for row in rows:
        for v in row.get("verify") or []:
            limit = (v.get("thresholds") or {}).get("min_snr_db")
            name = f"{v['graph']}@{row['target']['name']}"  # an adapter's graph reads "lora_mlp + adapter x"
            for o in v.get("outputs") or []:
                many = len(v["outputs"]) > 1 or o.get("slices")
                for part, m in [(o["name"], o), *((f"{o['name']}[{s['slice']}]", s) for s in o.get("slices") or [])]:
                    if m.get("snr_db") is None:
                        continue
                    ok = m.get("snr_ok", m.get("ok"))
                    bars.append({"label": f"{name} {part}" if many else name, "value": min(m["snr_db"], 120),
                                 "limit": limit, "ok": ok,
                                 "title": f"{name} {part}: SNR {m['snr_db']:.1f} dB, cosine "
                                          f"{m.get('cosine', float('nan')):.5f} (min SNR {limit} dB)"})
    if len(bars) > MAX_BARS:  # the failing ones first, then those closest to their threshold
        bars.sort(key=lambda b: (b["ok"] is not False, b["value"] - (b["limit"] or 0)))
    return hbars(bars, unit="dB", label="SNR per output against the threshold") if bars else None


def bin_sizes(rows: list[dict[str, Any]]) -> str | None:
    bars = [{"label": f"{r['recipe']}@{r['target']['name']}", "value": r["bin_size"], "ok": None,
             "title": f"{r['recipe']} for {r['target']['name']} (htp v{r['target'].get('htp_arch')}): "
                      f"{r['bin_size']} bytes"} for r in rows if r.get("bin_size")]
    if len(bars) > MAX_BARS:
        bars.sort(key=lambda b: -b["value"])  # the largest binaries
    return hbars(bars, unit="B", label=".bin size per SoC", fmt=format_size) if len(bars) > 1 else None


def layer_loss(layers: dict[str, Any]) -> str | None:
    """The diagnosed graph's worst nodes: the SNR of their output (lower is worse) on the side that loses."""
    key = "quant_snr_db" if layers.get("where") == "quantization" else "htp_snr_db"
    bars = [{"label": f"{n['node']} ({n['op_type']})", "value": max(n[key], 0), "ok": None,
             "title": f"{n['node']}: {key.split('_')[0]} SNR {n[key]:.1f} dB"} for n in layers.get("worst") or []
            if n.get(key) is not None]
    return hbars(bars, unit="dB", label=f"SNR per node ({layers.get('where')})") if bars else None


def search(s: dict[str, Any]) -> str | None:
    """Each candidate's worst-output SNR against its .bin size, the min SNR as a line: the winner is the
    smallest binary above it."""
    pts = []
    for c in s.get("candidates") or []:
        snrs = [o["snr_db"] for o in (c.get("outputs") or {}).values() if o.get("snr_db") is not None]
        if snrs and c.get("bin_size"):
            pts.append((c["name"], c["bin_size"], min(min(snrs), 120), c.get("passed"), c.get("winner")))
    if not pts:
        return None
    limit = (s.get("thresholds") or {}).get("min_snr_db")
    w, h, left, bottom = 520, 220, 60, 30
    xmax = max(p[1] for p in pts) * 1.15
    ymax = max([p[2] for p in pts] + [limit or 0]) * 1.15 or 1

    def xy(x: float, y: float) -> tuple[float, float]:
        return left + (w - left - 20) * x / xmax, (h - bottom) - (h - bottom - 10) * y / ymax
    body = [f'<line x1="{left}" x2="{left}" y1="10" y2="{h - bottom}" stroke="#9aa1ab"/>',
            f'<line x1="{left}" x2="{w - 20}" y1="{h - bottom}" y2="{h - bottom}" stroke="#9aa1ab"/>',
            f'<text x="{w - 20}" y="{h - 8}" text-anchor="end">.bin size (max {escape(format_size(max(p[1] for p in pts)))})</text>',
            '<text x="4" y="14">SNR dB</text>']
    if limit is not None:
        _, y = xy(0, limit)
        body.append(f'<line x1="{left}" x2="{w - 20}" y1="{y:.1f}" y2="{y:.1f}" stroke="{LIMIT}" stroke-width="2" '
                    f'stroke-dasharray="5 3"><title>min SNR {limit} dB</title></line>'
                    f'<text x="{left + 4}" y="{y - 4:.1f}" fill="{LIMIT}">min {limit} dB</text>')
    for name, size, snr, passed, winner in pts:
        x, y = xy(size, snr)
        colour = PASS if passed else FAIL
        ring = ' stroke="#000" stroke-width="2"' if winner else ""
        body.append(f'<g><title>{escape(name)}: SNR {snr:.1f} dB, {escape(format_size(size))}'
                    f'{" (winner)" if winner else ""}</title><circle cx="{x:.1f}" cy="{y:.1f}" '
                    f'r="{7 if winner else 5}" fill="{colour}" fill-opacity="0.85"{ring}/>'
                    f'<text x="{x + 9:.1f}" y="{y + 4:.1f}">{escape(name)}</text></g>')
    return _svg(w + 120, h, body, "precision search: SNR against .bin size")
