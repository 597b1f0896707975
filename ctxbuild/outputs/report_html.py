"""OUT/report.html from the report's data: the jinja2 template (compiled once into the user cache), its number
and size filters, and the inline SVG plots."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ctxbuild.templating import environment
from ctxbuild.units import fmt_size


def render_html(report: dict[str, Any], out: Path | None = None) -> str:
    import jinja2

    cache = None
    if out is not None:  # the compiled template, in the user cache: a fresh OUT skips the compile too
        from ctxbuild.layout import memo_dir

        class Memo(jinja2.FileSystemBytecodeCache):
            """A full or read-only cache dir costs the compile, never the report (jinja re-raises)."""

            def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
                try:
                    super().dump_bytecode(bucket)
                except OSError:
                    pass

        try:
            memo_dir("jinja").mkdir(parents=True, exist_ok=True)
            cache = Memo(str(memo_dir("jinja")))
        except OSError:  # a read-only cache dir: compile every time
            pass
    env = environment(autoescape=True, bytecode_cache=cache, auto_reload=True)
    env.filters.update(size=fmt_size, secs=fmt_secs, pct=fmt_pct, num=fmt_num)
    from ctxbuild.outputs import plots

    rows = report["rows"]
    drawn = {"accuracy": plots.accuracy(rows), "bins": plots.bin_sizes(rows),
             "search": [plots.search(r["search"]) if r.get("search") else None for r in rows],
             "layers": [{v["graph"]: plots.layer_loss(v["layers"]) for v in r["verify"] if v.get("layers")}
                        for r in rows]}
    return env.get_template("report.html.j2").render(r=report, b=report["build"],
                                                    plots={k: _markup(v) for k, v in drawn.items()})


def _markup(v: Any) -> Any:
    """The plots are SVG built with escaped text: mark them safe for the autoescaping template."""
    from markupsafe import Markup

    if isinstance(v, list):
        return [_markup(x) for x in v]
    if isinstance(v, dict):
        return {k: _markup(x) for k, x in v.items()}
    return None if v is None else Markup(v)


def fmt_secs(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 60:
        return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


def fmt_pct(f: float | None) -> str:
    return "—" if f is None else f"{f * 100:.1f}%"


def fmt_num(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)
