"""`ap-solve evaluate` and `ap-solve explain`: one plan's breakdown, limits and best changes."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from autoparallel_cp import api, outputs, report
from autoparallel_cp.cli.calibration_options import explain_sensitivity_lines, headroom_option
from autoparallel_cp.cli.common import (
    F,
    build_job,
    check_outputs,
    consoles,
    emit_settings,
    guarded,
    job_header,
    job_inputs,
    job_options,
    plan_of,
    step_of,
)
from autoparallel_cp.emit import EMIT_FORMATS, emit
from autoparallel_cp.search import capacity
from autoparallel_cp.spec import Job


def _plan_options(fn: F) -> F:
    opts = [
        click.option("--plan", "-p", "plan_text", required=True, metavar="K=V,...",
                     help='e.g. "tp=8,pp=4,mbs=1,recompute=selective,zero=1" (dp and '
                          "num_microbatches are derived)."),
        click.option("--json", "json_path", default=None, metavar="FILE|-",
                     help="Write the PLAN JSON; '-' for stdout."),
        click.option("--emit", "emit_fmt", type=click.Choice(EMIT_FORMATS), default=None,
                     help="Print launch settings of this plan."),
        click.option("--emit-out", default=None, metavar="FILE",
                     help="With --emit: write the settings to FILE (atomically)."),
        click.option("--trace", "trace_path", default=None, metavar="FILE.json",
                     help="Write the predicted step as a Chrome trace (open it in "
                          "ui.perfetto.dev or chrome://tracing)."),
        click.option("--html", "html_path", default=None, metavar="FILE.html",
                     help="Write a self-contained HTML report (needs plotly: the `html` "
                          "extra)."),
        click.option("--quiet", "-q", is_flag=True, help="No notes on stderr."),
        headroom_option,
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _require_html(html_path: str | None) -> None:
    """Exit 2 before any work when --html is given and plotly is missing."""
    if html_path:
        from autoparallel_cp.html_report import require_plotly

        require_plotly()


def _evaluate_and_report(job: Job, plan_text: str, json_path: str | None,
                         emit_fmt: str | None, emit_out: str | None, quiet: bool,
                         explain: bool, trace_path: str | None = None,
                         html_path: str | None = None) -> None:
    out, note = consoles(json_path, quiet, emit_out, trace_path, html_path)
    # as solve's plans (search/capacity.py): evaluated against the GPU's whole memory, a plan
    # above the --mem-headroom margin marked `memory.near_capacity` with its `oom_risk`
    full_job, headroom = capacity.to_capacity(job)
    ev = api.evaluate(full_job, plan_text)
    d = report.plans_from([ev])[0]
    capacity.annotate([d], headroom)
    emitted = emit(job, plan_of(ev), emit_fmt) if emit_fmt else None
    changes: list[Any] = []
    sensitivity: list[str] = []
    if explain:
        from autoparallel_cp.search.neighbours import single_changes

        # judged against the whole memory, as solve searches (a change above the margin
        # still fits; its breakdown says so)
        changes = single_changes(full_job, plan_of(ev), d)
        if changes:
            sensitivity = explain_sensitivity_lines(full_job, plan_of(ev), step_of(d), changes)
    items = [(json_path, outputs.plan_json(d))] if json_path else []
    if emitted is not None and emit_out:
        items.append((emit_out, emitted.text))
    if trace_path:
        from autoparallel_cp.trace import trace_json

        items.append((trace_path, trace_json(job, plan_of(ev), d)))
    if html_path:
        from autoparallel_cp.html_report import plans_report

        notes = report.limits(d) + [
            f"change {c.change}: step {report.fmt_time(c.step_s)} ({c.delta:+.1%}), needs "
            f"{report.gib(c.peak_bytes)} of {report.gib(c.capacity_bytes)} GiB"
            for c in changes[:5]] + sensitivity
        items.append((html_path, plans_report(
            job, [d], plan_of(ev), title=f"ap-solve {'explain' if explain else 'evaluate'}",
            subtitle=job_header(job), chosen=0, notes=notes,
            notes_heading="What limits it, the best single changes and their sensitivity"
            if explain else "What limits it")))
    outputs.write_all(items)  # together, once nothing can fail any more
    for path in (json_path, trace_path, html_path):
        if path and path != "-":
            note.print(f"wrote {path}")
    out.print(Text(job_header(job), style="bold"))
    report.print_plan_report(out, d, title="Plan breakdown" if not explain else "Explanation",
                             num_layers=job.model.num_layers, explain=explain)
    if explain:
        if changes:
            top = changes[0]
            out.print(Text("Change that would help most: ", style="bold") + Text(
                f"{top.change}: step {report.fmt_time(step_of(d))} -> "
                f"{report.fmt_time(top.step_s)} ({top.delta:+.1%}), needs "
                f"{report.gib(top.peak_bytes)} of {report.gib(top.capacity_bytes)} GiB"))
            table = Table(title="Best single changes (exact cost model)", title_justify="left",
                          header_style="bold")
            table.add_column("change")
            table.add_column("step", justify="right")
            table.add_column("vs now", justify="right")
            table.add_column("mem GiB", justify="right")
            # whether solve's proof covers the change (search/space_proof.py): a faster plan
            # outside the space does not contradict an "optimal (proven)" answer
            table.add_column("in solve's space")
            from autoparallel_cp.search.space import SearchSpace
            from autoparallel_cp.search.space_proof import outside

            space = SearchSpace.for_job(job)
            for ch in changes[:5]:
                why = outside(space, ch.plan)
                table.add_row(ch.change, report.fmt_time(ch.step_s), f"{ch.delta:+.1%}",
                              f"{report.gib(ch.peak_bytes)}/{report.gib(ch.capacity_bytes)}",
                              "yes" if why is None else f"no: {why}")
            out.print(table)
            for line in sensitivity:
                out.print(line)
        elif d.get("fits"):
            out.print("No single-axis change fits and is faster: the plan is locally optimal.")
    if emit_fmt:
        emit_settings(job, plan_of(ev), emit_fmt, emit_out, out, note, "this plan",
                      written=emitted)


@click.command()
@job_options
@_plan_options
@guarded
def evaluate(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
             global_batch: int, recipe: str, plan_text: str, json_path: str | None,
             emit_fmt: str | None, emit_out: str | None, trace_path: str | None,
             html_path: str | None, quiet: bool) -> None:
    """The memory and time breakdown of one given plan (also when it does not fit)."""
    check_outputs(job_inputs(model, cluster, recipe), json_path=json_path,
                  emit_out=emit_out, trace_path=trace_path, html_path=html_path)
    _require_html(html_path)
    job = build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _evaluate_and_report(job, plan_text, json_path, emit_fmt, emit_out, quiet, explain=False,
                         trace_path=trace_path, html_path=html_path)


@click.command()
@job_options
@_plan_options
@guarded
def explain(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
            global_batch: int, recipe: str, plan_text: str, json_path: str | None,
            emit_fmt: str | None, emit_out: str | None, trace_path: str | None,
            html_path: str | None, quiet: bool) -> None:
    """Explain one plan: breakdown, what limits it, and the changes that would help most."""
    check_outputs(job_inputs(model, cluster, recipe), json_path=json_path,
                  emit_out=emit_out, trace_path=trace_path, html_path=html_path)
    _require_html(html_path)
    job = build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _evaluate_and_report(job, plan_text, json_path, emit_fmt, emit_out, quiet, explain=True,
                         trace_path=trace_path, html_path=html_path)
