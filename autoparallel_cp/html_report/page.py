"""The `--html` page: its sections in order, the plans table, plotly.js inlined once.

Sections: the plans table; each plan's step-time and memory breakdowns as stacked bars; the
chosen plan's memory per pipeline stage against capacity (headroom and its nominal 80 %
interval, cost/uncertainty.py); its step timeline (cost/timeline.py, the slices
`--trace` writes); the near-tie and sensitivity lines (calibrate/advice.py); for `whatif`,
the sweep's curves. Figures are plotly's (`Figure.to_html`), the rest plain HTML.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from autoparallel_cp import report
from autoparallel_cp.cost.timeline import timeline
from autoparallel_cp.errors import UserError
from autoparallel_cp.html_report.figures import (
    TOP_LEGEND,
    memory_figure,
    stage_memory_section,
    time_figure,
    timeline_caption,
    timeline_figure,
)
from autoparallel_cp.search.capacity import risk_text
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       margin: 24px 32px; color: #222; background: #fff; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #555; margin-top: 0; }
table.plans { border-collapse: collapse; font-size: 13px; }
table.plans th, table.plans td { padding: 4px 8px; border-bottom: 1px solid #e4e4e4;
                                 text-align: right; white-space: nowrap; }
table.plans th { background: #f4f4f4; }
table.plans td.l, table.plans th.l { text-align: left; }
table.plans tr.chosen td { background: #eaf4ea; font-weight: 600; }
table.plans tr.rec td:first-child { color: #2e7d32; font-weight: 600; }
ul.notes { font-size: 14px; line-height: 1.5; }
p.note { font-size: 13px; color: #555; }
"""


def require_plotly() -> None:
    """Fail early (exit 2) when plotly, the `html` extra, is missing."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise UserError("--html needs plotly: pip install 'autoparallel-cp[html]'") from None


class _Page:
    """Sections in order; plotly.js goes inline with the first figure only."""

    def __init__(self, title: str, subtitle: str) -> None:
        self.title = title
        self.parts = [f"<h1>{html.escape(title)}</h1>",
                      f'<p class="sub">{html.escape(subtitle)}</p>']
        self._js = False

    def section(self, key: str, heading: str, body: str) -> None:
        self.parts.append(f'<section id="{key}"><h2>{html.escape(heading)}</h2>\n{body}'
                          "</section>")

    def figure(self, fig: Any) -> str:
        out = str(fig.to_html(full_html=False, include_plotlyjs=not self._js,
                              config={"displaylogo": False, "responsive": True}))
        self._js = True
        return out

    def html(self) -> str:
        body = "\n".join(self.parts)
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head>\n"
                f"<body>\n{body}\n</body></html>\n")


def _esc(x: Any) -> str:
    return html.escape(str(x))


def plans_table_html(plans: Sequence[Mapping[str, Any]], chosen: int | None,
                     recommended: int | None = None) -> str:
    """The plans as an HTML table (the terminal table's columns; `chosen`, the plan drawn
    below, highlighted; `recommended` (an index) marked "rec.")."""
    cols = ["#", "dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "m", "recompute",
            "mem GiB", "fits", "step", "tok/s/GPU", "MFU", "time goes to", "vs #1"]
    head = "".join(f'<th class="{"l" if c in ("recompute", "time goes to", "vs #1") else ""}"'
                   f">{_esc(c)}</th>" for c in cols)
    rows = []
    best = plans[0] if plans else {}
    for i, p in enumerate(plans):
        pl, mem, thr = p["plan"], p.get("memory", {}), p.get("throughput", {})
        rc = pl.get("recompute", "none")
        if pl.get("recompute_layers") is not None and rc != "none":
            rc += f" ({pl['recompute_layers']})"
        cells = [f"{i + 1} rec." if i == recommended else i + 1, pl.get("dp"), pl.get("tp"),
                 pl.get("pp"), pl.get("vpp"), pl.get("cp"),
                 pl.get("ep"), pl.get("sp"), pl.get("zero"), pl.get("mbs"),
                 pl.get("num_microbatches"), rc,
                 f"{report.gib(report.needed_bytes(mem))}/{report.gib(mem.get('capacity_bytes'))}"
                 + (f" {risk_text(p)}" if risk_text(p) else ""),
                 "yes" if p.get("fits") else "no",
                 report.fmt_time(p["time"]["step_s"]),
                 report.fmt_count(thr.get("tokens_per_s_per_gpu")),
                 "-" if thr.get("mfu") is None else f"{thr['mfu']:.1%}",
                 report.dominant(p), "best" if i == 0 else report.versus(p, best)]
        tds = "".join(f'<td class="{"l" if k in (11, 17, 18) else ""}">{_esc(c)}</td>'
                      for k, c in enumerate(cells))
        cls = " ".join(c for c, on in (("chosen", i == chosen), ("rec", i == recommended))
                       if on)
        rows.append(f'<tr class="{cls}">{tds}</tr>')
    return (f'<table class="plans"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
            "</tbody></table>")


def plans_report(job: Job, plans: Sequence[Mapping[str, Any]], chosen_plan: Plan, *,
                 title: str, subtitle: str, chosen: int | None = 0,
                 notes: Sequence[str] = (),
                 notes_heading: str = "Near-ties and sensitivity",
                 recommended: int | None = None) -> str:
    """The page of `solve` / `evaluate` / `explain`: `plans` are PLAN dicts (ranked),
    `subtitle` the job's one-line description, `chosen_plan` the plan whose stages and
    timeline are drawn (`plans[chosen]` when it is among them), `notes` the near-tie and
    sensitivity lines, `recommended` the index of the recommended plan in `plans`."""
    require_plotly()
    page = _Page(title, subtitle)
    d = plans[chosen] if chosen is not None else None
    page.section("plans", "Plans", plans_table_html(plans, chosen, recommended))
    page.section("time", "Step time by part", page.figure(time_figure(plans)))
    page.section("memory", "Memory by part (most loaded GPU)",
                 page.figure(memory_figure(plans)))
    which = f"plan #{chosen + 1}" if chosen is not None else "the chosen plan"
    if d is None:
        from autoparallel_cp.cost.evaluate import evaluate

        d = evaluate(job, chosen_plan).to_json()
    fig, text = stage_memory_section(job, chosen_plan, d)
    page.section("stages", f"Memory per pipeline stage of {which}",
                 page.figure(fig) + f'<p class="note">{_esc(text)}</p>')
    tl = timeline(job, chosen_plan)
    page.section("timeline", f"Step timeline of {which} (predicted)",
                 f'<p class="note">{_esc(timeline_caption(tl))}</p>'
                 + page.figure(timeline_figure(tl, chosen_plan))
                 + '<p class="note">The cost model\'s step: faded slices are communication '
                   "hidden behind compute; gaps on a stage faster than the slowest are waits "
                   "for it. The same slices as <code>--trace</code> (open that file in "
                   "ui.perfetto.dev or chrome://tracing).</p>")
    if notes:
        items = "".join(f"<li>{_esc(n)}</li>" for n in notes)
        page.section("advice", notes_heading, f'<ul class="notes">{items}</ul>')
    return page.html()


def whatif_report(rows: Sequence[Mapping[str, Any]], *, title: str, subtitle: str,
                  x_key: str, series_keys: Sequence[str], notes: Sequence[str] = (),
                  tokens: float | None = None) -> str:
    """The page of `whatif`: the sweep's table and its curves (tokens/s/GPU, MFU, and days
    to train or step time) over the swept quantity `x_key`, a curve per `series_keys` value."""
    require_plotly()
    from plotly.subplots import make_subplots

    page = _Page(title, subtitle)
    third = ("days", "days to train") if tokens else ("step_s", "step time (s)")
    panels = [("tokens_per_s_per_gpu", "tokens/s per GPU"), ("mfu", "MFU"), third]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in panels])
    series: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        name = ", ".join(f"{k}={r[k]}" for k in series_keys) or str(r["cluster"])
        series.setdefault(name, []).append(r)
    palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2", "#eeca3b",
               "#9d755d"]
    for k, (name, rs) in enumerate(series.items()):
        for col, (field, _) in enumerate(panels, 1):
            pts = [(r[x_key], r[field]) for r in rs if r[field] is not None]
            fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                            name=name, legendgroup=name, showlegend=col == 1,
                            line={"color": palette[k % len(palette)]}, row=1, col=col)
    numeric = all(isinstance(r[x_key], (int, float)) for r in rows)
    log = numeric and x_key in ("gpus", "seq_len", "global_batch")
    ticks = sorted({r[x_key] for r in rows}) if log else None
    for col in (1, 2, 3):
        fig.update_xaxes(title_text=x_key.replace("_", " "), row=1, col=col,
                         type="log" if log else None, tickvals=ticks)
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    fig.update_layout(height=460, legend={**TOP_LEGEND, "y": 1.12},
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    head = ["cluster", "gpus", "net GB/s", "seq", "batch", "status", "best plan", "step",
            "tok/s/GPU", "MFU", "mem GiB"]
    trs = []
    for r in rows:
        cells = [r["cluster"], r["gpus"], r["net_gbps"], r["seq_len"], r["global_batch"],
                 r["status"], report.plan_label(r["plan"]) if r["plan"] else "-",
                 report.fmt_time(r["step_s"]), report.fmt_count(r["tokens_per_s_per_gpu"]),
                 "-" if r["mfu"] is None else f"{r['mfu']:.1%}",
                 "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"]
        trs.append("<tr>" + "".join(f'<td class="{"l" if k in (0, 5, 6) else ""}">{_esc(c)}'
                                    "</td>" for k, c in enumerate(cells)) + "</tr>")
    ths = "".join(f'<th class="{"l" if k in (0, 5, 6) else ""}">{_esc(h)}</th>'
                  for k, h in enumerate(head))
    page.section("points", "Points", f'<table class="plans"><thead><tr>{ths}</tr></thead>'
                                     f'<tbody>{"".join(trs)}</tbody></table>')
    page.section("whatif", "What-if curves (best plan per point)", page.figure(fig))
    if notes:
        items = "".join(f"<li>{_esc(n)}</li>" for n in notes)
        page.section("advice", "Summary", f'<ul class="notes">{items}</ul>')
    return page.html()
