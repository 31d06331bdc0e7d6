"""`--html FILE`: one self-contained page (plotly.js inlined, no network needed to view it).

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
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.schedules import Op
from autoparallel_cp.cost.timeline import ROWS, Slice, Timeline, timeline
from autoparallel_cp.errors import UserError
from autoparallel_cp.search.capacity import risk_text
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.trace import ROW_NAMES, stage_ranks

GIB = report.GIB
#: Most slices the timeline figure draws one by one, and most passes it draws at all.
MAX_SLICES = 20_000
MAX_PASSES = 40_000

#: Step-time parts: (INTERFACE.md `time` field, timeline kind, label, colour).
TIME_PARTS = (
    ("compute_s", "compute", "compute", "#4c78a8"),
    ("bubble_s", "bubble", "pipeline bubble", "#bab0ac"),
    ("tp_comm_s", "tp", "TP comm", "#f58518"),
    ("cp_comm_s", "cp", "CP comm", "#e45756"),
    ("ep_comm_s", "ep", "EP comm", "#b279a2"),
    ("pp_comm_s", "pp", "PP comm", "#72b7b2"),
    ("dp_comm_s", "dp", "DP comm", "#54a24b"),
    ("optimizer_s", "optimizer", "optimizer", "#eeca3b"),
    ("fixed_s", "fixed", "fixed per step", "#9d755d"),
)
KIND_COLOUR = {kind: colour for _, kind, _, colour in TIME_PARTS}
KIND_LABEL = {kind: label for _, kind, label, _ in TIME_PARTS}
#: Memory parts: (INTERFACE.md `memory` field, label, colour).
MEMORY_PARTS = (
    ("params_bytes", "parameters", "#4c78a8"),
    ("grads_bytes", "gradients", "#72b7b2"),
    ("optimizer_bytes", "optimizer states", "#eeca3b"),
    ("activations_bytes", "activations", "#f58518"),
    ("other_bytes", "other", "#b279a2"),
    ("overhead_bytes", "runtime overhead", "#bab0ac"),
)

#: Legends above the plot, left-aligned (clear of the axis titles).
_TOP_LEGEND = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0,
               "traceorder": "normal"}
_MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}

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


def _labels(plans: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"#{i + 1} {report.plan_label(p['plan'])}" for i, p in enumerate(plans)]


def time_figure(plans: Sequence[Mapping[str, Any]]) -> Any:
    """Step time of each plan, stacked by part (seconds)."""
    import plotly.graph_objects as go

    labels = _labels(plans)
    fig = go.Figure()
    for field, _, label, colour in TIME_PARTS:
        xs = [float(p["time"].get(field) or 0.0) for p in plans]
        if any(xs):
            fig.add_bar(y=labels, x=xs, name=label, orientation="h", marker_color=colour,
                        hovertemplate=f"{label}: %{{x:.3f}} s<extra>%{{y}}</extra>")
    fig.update_layout(barmode="stack", xaxis_title="seconds per step",
                      yaxis={"autorange": "reversed"}, legend=_TOP_LEGEND,
                      height=150 + 34 * len(plans), margin=_MARGIN)
    return fig


def memory_figure(plans: Sequence[Mapping[str, Any]]) -> Any:
    """Memory on each plan's most loaded GPU, stacked by part, against its capacity (GiB)."""
    import plotly.graph_objects as go

    labels = _labels(plans)
    fig = go.Figure()
    for field, label, colour in MEMORY_PARTS:
        xs = [float(p["memory"].get(field) or 0.0) / GIB for p in plans]
        if any(xs):
            fig.add_bar(y=labels, x=xs, name=label, orientation="h", marker_color=colour,
                        hovertemplate=f"{label}: %{{x:.2f}} GiB<extra>%{{y}}</extra>")
    fig.add_scatter(y=labels, x=[float(p["memory"]["capacity_bytes"]) / GIB for p in plans],
                    mode="markers", name="capacity",
                    marker={"symbol": "line-ns-open", "size": 22, "color": "#d62728",
                            "line": {"width": 3}},
                    hovertemplate="capacity: %{x:.2f} GiB<extra>%{y}</extra>")
    fig.update_layout(barmode="stack", xaxis_title="GiB on the most loaded GPU",
                      yaxis={"autorange": "reversed"}, legend=_TOP_LEGEND,
                      height=150 + 34 * len(plans), margin=_MARGIN)
    return fig


def stage_memory_section(job: Job, plan: Plan, d: Mapping[str, Any]) -> tuple[Any, str]:
    """(figure, sentence): memory per pipeline stage of one plan against capacity, and its
    headroom with the nominal 80 % interval of the most loaded stage's peak."""
    import plotly.graph_objects as go

    stages = stage_memory(job, plan)
    names = [f"stage {s.stage} (ranks {'-'.join(str(r) for r in stage_ranks(job, plan, s.stage))})"
             for s in stages]
    fig = go.Figure()
    for field, label, colour in MEMORY_PARTS:
        ys = [float(getattr(s, field)) / GIB for s in stages]
        if any(ys):
            fig.add_bar(x=names, y=ys, name=label, marker_color=colour,
                        hovertemplate=f"{label}: %{{y:.2f}} GiB<extra>%{{x}}</extra>")
    fig.add_scatter(x=names, y=[s.capacity_bytes / GIB for s in stages], mode="lines+markers",
                    name="capacity", line={"color": "#d62728", "dash": "dash"})
    mem = d["memory"]
    margin = float(mem.get("mem_headroom") or job.mem_headroom)
    if margin > 0 and not job.mem_headroom:  # capacity up to the whole memory: the margin
        fig.add_scatter(x=names, y=[s.capacity_bytes * (1 - margin) / GIB for s in stages],
                        mode="lines", name=f"memory margin ({margin:.1%} kept free)",
                        line={"color": "#ff9896", "dash": "dot"})
    worst = int(mem["stage"])
    iv = mem.get("peak_bytes_interval")
    if iv:
        over = float(mem["overhead_bytes"])
        lo, hi = (float(iv[0]) + over) / GIB, (float(iv[1]) + over) / GIB
        mid = float(mem["required_bytes"]) / GIB
        fig.add_scatter(x=[names[worst]], y=[mid], mode="markers", name="80% interval",
                        marker={"color": "#222", "size": 7},
                        error_y={"type": "data", "symmetric": False, "array": [hi - mid],
                                 "arrayminus": [mid - lo], "thickness": 2, "width": 10})
    fig.update_layout(barmode="stack", yaxis_title="GiB", legend=_TOP_LEGEND, height=440,
                      margin=_MARGIN)
    cap = float(mem["capacity_bytes"])
    req = float(mem["required_bytes"])
    text = (f"Most loaded: stage {worst}, {report.gib(req)} of {report.gib(cap)} GiB "
            f"(peak + runtime overhead): headroom {report.gib(cap - req)} GiB")
    if iv:
        over = float(mem["overhead_bytes"])
        text += (f", {report.gib(cap - over - float(iv[1]))} to "
                 f"{report.gib(cap - over - float(iv[0]))} GiB over the peak's nominal 80 % "
                 "interval")
    if job.mem_headroom > 0:
        text += (f"; the capacity is after the {job.mem_headroom:.1%} kept free "
                 "(--mem-headroom)")
    elif margin > 0:
        near = "above" if mem.get("near_capacity") else "within"
        text += f"; {near} the {margin:.1%} memory margin (--mem-headroom)"
        if mem.get("oom_risk") is not None and mem.get("near_capacity"):
            text += f", {float(mem['oom_risk']):.0%} risk of running out of memory"
    return fig, text + "."


def drawn_slices(tl: Timeline) -> tuple[list[Slice], str]:
    """The slices the page draws, and a note when they are fewer than the timeline's: past
    MAX_SLICES, one bar per pass (its compute and exposed communication together); past
    MAX_PASSES passes, those of the slowest stage only. A browser draws some 30,000 bars in
    seconds, 140,000 in minutes (headless Chromium, measured); `--trace` keeps every slice."""
    if len(tl.slices) <= MAX_SLICES:
        return list(tl.slices), ""
    spans: dict[tuple[int, Op], tuple[float, float]] = {}
    for s in tl.slices:
        if s.op is not None:
            a, b = spans.get((s.stage, s.op), (s.start_s, s.end_s))
            spans[(s.stage, s.op)] = (min(a, s.start_s), max(b, s.end_s))
    keep = (set(range(tl.pp)) if len(spans) <= MAX_PASSES else {tl.slowest_stage})
    passes = [Slice(j, "compute", "compute", "pass: compute and exposed communication", a,
                    b - a, op=op, critical=j == tl.slowest_stage)
              for (j, op), (a, b) in spans.items() if j in keep]
    rest = [s for s in tl.slices if s.op is None and s.stage in keep]
    note = (f"{len(tl.slices):,} slices: each pass is drawn as one bar (its compute and exposed "
            "communication together)")
    if len(keep) < tl.pp:
        note += f", for the slowest stage ({tl.slowest_stage}) only"
    return passes + rest, note + "; --trace writes every slice."


def timeline_figure(tl: Timeline, plan: Plan) -> Any:
    """The step's slices as a Gantt chart: a row per stage and kind of work (milliseconds)."""
    import plotly.graph_objects as go

    slices, _ = drawn_slices(tl)
    used = {(s.stage, s.row) for s in slices}
    cats = [f"stage {j} · {ROW_NAMES[r]}" for j in range(tl.pp) for r in ROWS
            if (j, r) in used]
    groups: dict[tuple[str, bool], list[Any]] = {}
    for s in slices:
        groups.setdefault((s.kind, s.exposed), []).append(s)
    fig = go.Figure()
    for _, kind, label, colour in TIME_PARTS:
        for exposed in (True, False):
            sl = groups.get((kind, exposed))
            if not sl:
                continue
            text = [s.name if s.op is None else
                    f"{s.op.phase}{s.op.microbatch}"
                    f"{f' chunk {s.op.chunk}' if plan.vpp > 1 else ''}: {s.name}" for s in sl]
            fig.add_bar(
                y=[f"stage {s.stage} · {ROW_NAMES[s.row]}" for s in sl],
                x=[s.dur_s * 1e3 for s in sl], base=[s.start_s * 1e3 for s in sl],
                orientation="h", marker_color=colour, opacity=1.0 if exposed else 0.35,
                marker_line_width=0.3 if len(slices) < 3000 else 0.0,
                marker_line_color="#ffffff",
                name=label if exposed else f"{label} (overlapped)", customdata=text,
                hovertemplate="%{customdata}<br>%{base:.2f} ms + %{x:.3f} ms<extra></extra>")
    fig.update_layout(
        barmode="overlay", bargap=0.15, xaxis_title="milliseconds from the step's start",
        yaxis={"categoryorder": "array", "categoryarray": cats, "autorange": "reversed"},
        height=130 + 22 * len(cats), legend=_TOP_LEGEND, margin=_MARGIN)
    return fig


def timeline_caption(tl: Timeline) -> str:
    """One line under the timeline's heading: schedule, micro-batches, step, slowest stage."""
    _, note = drawn_slices(tl)
    return (f"{tl.schedule} schedule, {tl.num_microbatches} micro-batches, step "
            f"{report.fmt_time(tl.step_s)}, pipeline {report.fmt_time(tl.pipeline_s)}; "
            f"stage {tl.slowest_stage} is the slowest and sets the pace."
            + (f" {note}" if note else ""))


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
    fig.update_layout(height=460, legend={**_TOP_LEGEND, "y": 1.12},
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
