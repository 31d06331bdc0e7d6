"""The figures of the `--html` page (plotly): step-time and memory breakdowns as stacked bars,
memory per pipeline stage against capacity with the headroom and its nominal 80 % interval
(cost/uncertainty.py), and the step's timeline (cost/timeline.py, the slices `--trace` writes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoparallel_cp import report
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.pass_order import Op
from autoparallel_cp.cost.timeline import ROWS, Slice, Timeline
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import SPLIT_BACKWARD
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
    ("offload_s", "offload", "host offload", "#ff9da6"),
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
TOP_LEGEND = {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0,
               "traceorder": "normal"}
MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}


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
                      yaxis={"autorange": "reversed"}, legend=TOP_LEGEND,
                      height=150 + 34 * len(plans), margin=MARGIN)
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
                      yaxis={"autorange": "reversed"}, legend=TOP_LEGEND,
                      height=150 + 34 * len(plans), margin=MARGIN)
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
    fig.update_layout(barmode="stack", yaxis_title="GiB", legend=TOP_LEGEND, height=440,
                      margin=MARGIN)
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
                    f"{s.op.phase}{s.op.microbatch}{_chunk(tl, s.op)}: {s.name}" for s in sl]
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
        height=130 + 22 * len(cats), legend=TOP_LEGEND, margin=MARGIN)
    return fig


def _chunk(tl: Timeline, op: Op) -> str:
    if tl.schedule == "dualpipe":
        return f" line {op.chunk}"
    return f" chunk {op.chunk}" if tl.vpp > 1 else ""


def timeline_caption(tl: Timeline) -> str:
    """One line under the timeline's heading: schedule, micro-batches, step, slowest stage,
    and the cost model's gap to the replay of its order when there is one."""
    _, note = drawn_slices(tl)
    passes = ("F forward, B input gradient, W weight gradient, BW a whole backward; "
              "F&B pairs run together" if tl.schedule in SPLIT_BACKWARD else
              "F forward, B backward")
    gap = ""
    if tl.model_gap_s > 0:
        gap = (f" Replayed with every dependency, this order runs "
               f"{report.fmt_time(tl.model_gap_s)} longer than the predicted step "
               f"({tl.model_gap_s / tl.step_s:.1%}): the cost model's pipeline bubble is "
               "optimistic for this layout; the extra idle time is drawn as bubble.")
    return (f"{tl.schedule} schedule, {tl.num_microbatches} micro-batches ({passes}), step "
            f"{report.fmt_time(tl.step_s)}, pipeline {report.fmt_time(tl.pipeline_s)}; "
            f"stage {tl.slowest_stage} is the slowest and sets the pace."
            + gap + (f" {note}" if note else ""))


