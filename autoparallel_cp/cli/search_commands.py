"""`ap-solve solve` and `ap-solve enumerate`: the k best plans and the recommendation."""

from __future__ import annotations

from typing import Any

import click
from rich.text import Text

from autoparallel_cp import api, report
from autoparallel_cp.cli.calibration_options import uncertainty_lines
from autoparallel_cp.cli.common import (
    MAX_WORKERS,
    ProgressLine,
    Timeout,
    build_job,
    check_outputs,
    consoles,
    emit_settings,
    guarded,
    job_header,
    job_inputs,
    job_options,
    plan_of,
    result_parts,
    search_options,
    step_of,
    time_limit_option,
    write_outputs,
)
from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.search import capacity
from autoparallel_cp.search.schedule_axis import BOUND_RATIO
from autoparallel_cp.search.space_proof import proof_space, space_line
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.framework_space import Restriction
from autoparallel_cp.spec.plan import plan_violations


def _run_search(kind: str, job: Job, *, fix: str | None, top_k: int, objective: str,
                 tolerance: float, csv_path: str | None, json_path: str | None,
                 emit_fmt: str | None, emit_rank: int | None, emit_out: str | None,
                 quiet: bool, time_limit: float | None = None,
                 workers: int | None = None, trace_path: str | None = None,
                 trace_rank: int = 1, html_path: str | None = None) -> None:
    out, note = consoles(json_path, quiet, csv_path, emit_out, trace_path, html_path)
    # the search keeps to the plans the --emit format, else the recipe's framework, runs
    # (spec/framework_space.py); a format that cannot train the job at all is named first (a
    # recipe only costs the job as its framework would, whatever the model)
    restriction = Restriction.of(job, emit_fmt)
    if emit_fmt and restriction is not None and (why := restriction.job_refusal()):
        raise UserError(why)
    # near-capacity plans stay visible (search/capacity.py): the search admits every plan that
    # fits the GPU's memory; --mem-headroom marks the risky ones and keeps them out of the
    # recommendation
    full_job, headroom = capacity.to_capacity(job)

    def search(j: Job, k: int, prior: Any = None) -> Any:
        if kind == "solve":
            with ProgressLine(not quiet, "CP-SAT") as progress:
                return api.solve(j, top_k=k, time_limit=time_limit, workers=workers,
                                 objective=objective, fix=fix, progress=progress,
                                 emit=emit_fmt, prior=prior)
        return api.enumerate_plans(j, top_k=k, objective=objective, fix=fix, emit=emit_fmt)

    result = search(full_job, top_k)
    status, solve_time, space, evs = result_parts(result)
    stats = getattr(result, "stats", {}) or {}
    wall_net = bool(stats.get("wall_clock_net_hit"))
    pess = stats.get("pessimistic_step_s")  # --objective robust: the ranking's step times
    dicts = report.plans_from(evs)
    if not dicts:
        # a time-out, not an infeasibility proof (INTERFACE.md: exit 3, JSON status timeout)
        write_outputs("timeout", solve_time, space, [], csv_path, json_path, note)
        budget = (f"--time-limit {time_limit:g} s" if time_limit is not None else "the limit")
        why = (f"the wall-clock safety net stopped the search after {solve_time:.1f} s"
               if wall_net else f"{budget} ran out after {solve_time:.1f} s")
        raise Timeout(f"no plan found within the time limit ({why}); infeasibility is not "
                      "proven: raise --time-limit, or narrow the space with --fix")
    capacity.annotate(dicts, headroom)
    if pess is not None:
        for d, ps in zip(dicts, pess, strict=True):
            d["time"]["pessimistic_step_s"] = ps
    sp_obj = getattr(result, "searched", None)
    space_desc = proof_space(sp_obj) if sp_obj is not None else None

    # the recommendation: among the plans within the margin, ranked by the objective's step
    # (the pessimistic job's for robust: its solve's proofs are in `result.context`)
    rjob = stats.get("pessimistic_job") or job
    steps = pess if pess is not None else [step_of(d) for d in dicts]
    ranked = [(plan_of(ev), t) for ev, t in zip(evs, steps, strict=True)]
    safe = capacity.safe_ranked(ranked, dicts)
    context = getattr(result, "context", None)
    safe_status = "optimal"
    if capacity.needs_safe_search(dicts):
        # #1 is near capacity: the fastest plan within the margin is not among the k best
        try:
            # the first search's proven bounds and key results hold within the margin too
            # (search/capacity.py `reuse`)
            sres = search(job, 1, getattr(result, "context", None))
        except InfeasibleError:
            sres = None
        if sres is not None:
            safe_status = sres.status
        if sres is not None and sres.plans:
            st = (sres.stats or {}).get("pessimistic_step_s") or [sres.plans[0].time.step_s]
            safe = [(plan_of(sres.plans[0]), float(st[0])), *safe]
            context = getattr(sres, "context", None)
    from autoparallel_cp.search.recommend import recommend
    from autoparallel_cp.spec.plan import canonical

    rec = None
    if safe:
        rjob_safe = rjob if headroom == 0 else rjob.model_copy(
            update={"mem_headroom": headroom})
        with ProgressLine(not quiet, f"CP-SAT phase 2 (simplest within {tolerance:.0%})"):
            rec = recommend(rjob_safe, safe, tolerance, fix=fix,
                            time_limit=time_limit if time_limit is not None else 10.0,
                            workers=workers, context=context)
        if headroom > 0 and _near(full_job, rec.plan, headroom):
            # phase 2 over the space up to capacity chose a near-capacity plan: search the
            # space within the margin again, without the proofs of the space up to capacity
            with ProgressLine(not quiet, f"CP-SAT phase 2 (simplest within {tolerance:.0%})"):
                rec = recommend(rjob_safe, safe, tolerance, fix=fix,
                                time_limit=time_limit if time_limit is not None else 10.0,
                                workers=workers, context=None)
        if restriction is not None and (restriction.key_refusals(rec.plan)
                                        or restriction.split_refusals(rec.plan)):
            # phase 2 fell back to a space without the restriction: keep the simplest of the
            # k best, which are all plans the frameworks run
            rec = recommend(rjob_safe, safe, tolerance, fix=fix, phase_two=False)
    rec_rank = None
    if rec is not None:
        rec_key = canonical(rec.plan, job.model.num_layers).key()
        rec_rank = next((i for i, (p, _) in enumerate(ranked, 1)
                         if canonical(p, job.model.num_layers).key() == rec_key), None)

    chosen, label, emitted = None, "", None
    if emit_fmt:
        if emit_rank is not None:
            if emit_rank > len(ranked):
                raise UserError(f"--emit-rank {emit_rank}: only {len(ranked)} plans")
            chosen, label = ranked[emit_rank - 1][0], f"plan #{emit_rank}"
        elif rec is not None:
            chosen, label = rec.plan, "the recommended plan"
        else:
            chosen, label = ranked[0][0], "plan #1 (no plan within the memory margin)"
        from autoparallel_cp.emit import emit

        emitted = emit(job, chosen, emit_fmt)  # before any file is written: it may refuse
    extra = [(emit_out, emitted.text)] if emitted is not None and emit_out else []
    notes = uncertainty_lines(job, dicts, [p for p, _ in ranked])
    if trace_path or html_path:
        if trace_rank > len(ranked):
            raise UserError(f"--trace-rank {trace_rank}: only {len(ranked)} plans")
        traced = ranked[trace_rank - 1][0]
        if trace_path:
            from autoparallel_cp.trace import trace_json

            extra.append((trace_path, trace_json(full_job, traced, dicts[trace_rank - 1])))
        if html_path:
            from autoparallel_cp.html_report import plans_report

            if rec is None:
                rec_lines = ["recommended: none within the memory margin"]
            else:
                rec_lines = [f"recommended: #{rec_rank}" if rec_rank is not None else
                             f"recommended: {rec.plan.short()}", rec.why()]
            extra.append((html_path, plans_report(
                full_job, dicts, traced, title=f"ap-solve {kind}", subtitle=job_header(job),
                chosen=trace_rank - 1, notes=rec_lines + notes,
                recommended=rec_rank - 1 if rec_rank is not None else None)))
    # every search phase is done: write the outputs together (an interrupt before this line
    # leaves every existing output file as it was)
    write_outputs(status, solve_time, space, dicts, csv_path, json_path, note, extra=extra,
                  space_desc=space_desc)
    for path in (trace_path, html_path):
        if path and path != "-":
            note.print(f"wrote {path}")

    out.print(Text(job_header(job), style="bold"))
    space_txt = (f"{space:.2g}" if isinstance(space, int) and space >= 10**9 else
                 f"{space:,}" if isinstance(space, int) else str(space))
    gap = getattr(result, "gap", None)
    if status == "optimal":
        proof = " (proven)"
    elif isinstance(gap, float) and gap > 0:
        proof = f" (time limit hit, gap {gap:.2%}: raise --time-limit)"
    else:
        proof = " (time limit hit before the proof: raise --time-limit)"
    runs = f" that {restriction.describe()} runs" if restriction is not None else ""
    out.print(f"{kind}: status {status}{proof}, {solve_time:.2f} s, space {space_txt} plans"
              f"{runs}, objective {objective}")
    if space_desc is not None:
        out.print("  " + space_line(space_desc), markup=False, highlight=False, soft_wrap=True)
    if wall_net:
        note.print("note: the wall-clock safety net (3x --time-limit + 30 s) stopped the "
                   "search, not its deterministic budget: on a less loaded machine the answer "
                   "may differ")
    out.print(report.plans_table(dicts, highlight=rec_rank, compare=True))
    best = dicts[0]
    if pess is not None:
        out.print("objective robust: ranked by the pessimistic step time (every calibration knob "
                  "at the slow end of its 80% range): " + ", ".join(
                      f"#{i} {report.fmt_time(ps)}" for i, ps in enumerate(pess, 1)))
    out.print(Text("fastest:     " if pess is None else "best robust: ", style="bold") + Text(
        f"#1 {report.plan_label(best['plan'])}  step {report.fmt_time(step_of(best))}, "
        f"{report.fmt_count(best['throughput'].get('tokens_per_s_per_gpu'))} tok/s/GPU"
        + capacity.risk_note(best)))
    if ranked[0][0].schedule in BOUND_RATIO:  # which bubble the ZB / V schedule removes
        out.print("  " + _schedule_contrast(full_job, ranked[0][0], best))
    if ranked[0][0].optimizer_offload:  # which GPU memory the host offload removes
        on_gpu = ranked[0][0].model_copy(update={"optimizer_offload": 0.0})
        out.print("  " + report.offload_line(
            best, report.plans_from([api.evaluate(full_job, on_gpu)])[0]),
            markup=False, highlight=False, soft_wrap=True)
    if ranked[0][0].activation_offload:  # which activations the host offload removes
        kept = ranked[0][0].model_copy(update={"activation_offload": 0})
        out.print("  " + report.act_offload_line(
            best, report.plans_from([api.evaluate(full_job, kept)])[0]),
            markup=False, highlight=False, soft_wrap=True)
    if rec is None:
        out.print(Text("recommended: ", style="bold yellow") + Text(
            f"none within the memory margin (--mem-headroom {headroom:g}): "
            + ("every plan that fits is near capacity" if safe_status == "optimal" else
               "none was found within the time limit (raise --time-limit)")
            + "; the table's ! marks give each plan's risk of running out of memory"))
    else:
        if rec_rank is not None:
            rd = dicts[rec_rank - 1]
            rec_text = f"#{rec_rank} {report.plan_label(rd['plan'])}"
        else:
            rd = report.plans_from([api.evaluate(full_job, rec.plan)])[0]
            rec_text = report.plan_label(rd["plan"])
        margin = (f", within the {headroom:.1%} memory margin" if headroom > 0 and
                  any(capacity.is_near(d) for d in dicts) else "")
        out.print(Text("recommended: ", style="bold green") + Text(
            f"{rec_text}  step {report.fmt_time(step_of(rd))}, "
            f"{report.fmt_count(rd['throughput'].get('tokens_per_s_per_gpu'))} tok/s/GPU, "
            f"mem {report.gib(report.needed_bytes(rd['memory']))} GiB "
            f"(simplest within {tolerance:.0%}{margin}, {rec.method})"))
        why = rec.why() + (" (pessimistic step times)" if pess is not None else "")
        if capacity.needs_safe_search(dicts):
            best_word = "fastest" if pess is None else "best robust"
            why = (f"#1 is near capacity: this is the {best_word} plan within the memory "
                   f"margin, and the simplest within {tolerance:.0%} of it (complexity "
                   f"{rec.complexity})." if rec.same_as_fastest else
                   f"#1 is near capacity: this is the simplest plan within {tolerance:.0%} of "
                   f"the {best_word} plan within the memory margin; " + why)
        out.print("  " + why)
    for line in notes:
        out.print("  " + line)

    if emit_fmt and chosen is not None:
        emit_settings(job, chosen, emit_fmt, emit_out, out, note, label, written=emitted)


def _require_html(html_path: str | None) -> None:
    """Exit 2 before any work when --html is given and plotly is missing."""
    if html_path:
        from autoparallel_cp.html_report import require_plotly

        require_plotly()


def _near(job: Job, plan: Any, headroom: float) -> bool:
    """Whether `plan` is above the memory margin (evaluated against the whole memory)."""
    d = report.plans_from([api.evaluate(job, plan)])
    capacity.annotate(d, headroom)
    return capacity.is_near(d[0])


@click.command()
@job_options
@search_options
@time_limit_option
@click.option("--workers", type=click.IntRange(min=1, max=MAX_WORKERS), default=None,
              help="CP-SAT workers for the recommendation's fallback master model (default 1: "
                   "deterministic; more can be faster, but a cut-short answer may then depend "
                   "on the machine's load).")
@guarded
def solve(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
          global_batch: int, recipe: str, fix: str | None, top_k: int, objective: str,
          tolerance: float, csv_path: str | None, json_path: str | None,
          emit_fmt: str | None, emit_rank: int | None, emit_out: str | None,
          trace_path: str | None, trace_rank: int, html_path: str | None, quiet: bool,
          time_limit: float, workers: int | None) -> None:
    """The optimal and k best distinct plans, found by CP-SAT."""
    check_outputs(job_inputs(model, cluster, recipe), csv_path=csv_path,
                  json_path=json_path, emit_out=emit_out, trace_path=trace_path,
                  html_path=html_path)
    _require_html(html_path)
    job = build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _run_search("solve", job, fix=fix, top_k=top_k, objective=objective, tolerance=tolerance,
                csv_path=csv_path, json_path=json_path, emit_fmt=emit_fmt,
                emit_rank=emit_rank, emit_out=emit_out, quiet=quiet, time_limit=time_limit,
                workers=workers, trace_path=trace_path, trace_rank=trace_rank,
                html_path=html_path)


@click.command("enumerate")
@job_options
@search_options
@guarded
def enumerate_cmd(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
                  global_batch: int, recipe: str, fix: str | None, top_k: int, objective: str,
                  tolerance: float, csv_path: str | None, json_path: str | None,
                  emit_fmt: str | None, emit_rank: int | None, emit_out: str | None,
                  trace_path: str | None, trace_rank: int, html_path: str | None,
                  quiet: bool) -> None:
    """The exhaustive reference search over the same space (for checking the solver)."""
    check_outputs(job_inputs(model, cluster, recipe), csv_path=csv_path,
                  json_path=json_path, emit_out=emit_out, trace_path=trace_path,
                  html_path=html_path)
    _require_html(html_path)
    job = build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _run_search("enumerate", job, fix=fix, top_k=top_k, objective=objective,
                tolerance=tolerance, csv_path=csv_path, json_path=json_path,
                emit_fmt=emit_fmt, emit_rank=emit_rank, emit_out=emit_out, quiet=quiet,
                trace_path=trace_path, trace_rank=trace_rank, html_path=html_path)


def _schedule_contrast(job: Job, plan: Any, best: dict[str, Any]) -> str:
    """`report.schedule_line` of `plan` against the same plan under its default schedule; a
    split that schedule cannot run (a V's rank 0 without layers: spec/plan.py
    `empty_first_ok`) is compared with the default schedule's own split, and said so."""
    as_default = plan.model_copy(update={"schedule": None})
    resplit = bool(plan_violations(job, as_default))
    if resplit:
        as_default = as_default.model_copy(update={"stage_layers": None, "chunk_layers": None})
        if plan_violations(job, as_default):
            return (f"schedule {plan.schedule} (its layer split has no counterpart under the "
                    "default schedule)")
    return report.schedule_line(best, report.plans_from([api.evaluate(job, as_default)])[0],
                                resplit=resplit)
