"""`ap-solve solve` and `ap-solve enumerate`: the k best plans and the recommendation."""

from __future__ import annotations

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
    job_options,
    plan_of,
    result_parts,
    search_options,
    step_of,
    time_limit_option,
    write_outputs,
)
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.framework_space import Restriction


def _run_search(kind: str, job: Job, *, fix: str | None, top_k: int, objective: str,
                 tolerance: float, csv_path: str | None, json_path: str | None,
                 emit_fmt: str | None, emit_rank: int | None, emit_out: str | None,
                 quiet: bool, time_limit: float | None = None,
                 workers: int | None = None) -> None:
    out, note = consoles(json_path, quiet)
    # the search keeps to the plans the --emit format, else the recipe's framework, runs
    # (spec/framework_space.py); a format that cannot train the job at all is named first (a
    # recipe only costs the job as its framework would, whatever the model)
    restriction = Restriction.of(job, emit_fmt)
    if emit_fmt and restriction is not None and (why := restriction.job_refusal()):
        raise UserError(why)
    if kind == "solve":
        with ProgressLine(not quiet, "CP-SAT") as progress:
            result = api.solve(job, top_k=top_k, time_limit=time_limit, workers=workers,
                               objective=objective, fix=fix, progress=progress, emit=emit_fmt)
    else:
        result = api.enumerate_plans(job, top_k=top_k, objective=objective, fix=fix,
                                     emit=emit_fmt)
    status, solve_time, space, evs = result_parts(result)
    stats = getattr(result, "stats", {}) or {}
    wall_net = bool(stats.get("wall_clock_net_hit"))
    dicts = report.plans_from(evs)
    if not dicts:
        # a time-out, not an infeasibility proof (INTERFACE.md: exit 3, JSON status timeout)
        write_outputs("timeout", solve_time, space, [], csv_path, json_path, note)
        budget = (f"--time-limit {time_limit:g} s" if time_limit is not None else "the limit")
        why = (f"the wall-clock safety net stopped the search after {solve_time:.1f} s"
               if wall_net else f"{budget} ran out after {solve_time:.1f} s")
        raise Timeout(f"no plan found within the time limit ({why}); infeasibility is not "
                      "proven: raise --time-limit, or narrow the space with --fix")

    ranked = [(plan_of(ev), step_of(d)) for ev, d in zip(evs, dicts, strict=True)]
    from autoparallel_cp.search.recommend import recommend
    from autoparallel_cp.spec.plan import canonical

    with ProgressLine(not quiet, f"CP-SAT phase 2 (simplest within {tolerance:.0%})"):
        rec = recommend(job, ranked, tolerance, evaluations=evs, fix=fix,
                        time_limit=time_limit if time_limit is not None else 10.0,
                        workers=workers, context=getattr(result, "context", None))
    if restriction is not None and (restriction.key_refusals(rec.plan)
                                    or restriction.split_refusals(rec.plan)):
        # phase 2 fell back to a space without the restriction: keep the simplest of the k
        # best, which are all plans the frameworks run
        rec = recommend(job, ranked, tolerance, evaluations=evs, fix=fix, phase_two=False)
    rec_key = canonical(rec.plan, job.model.num_layers).key()
    rec_rank = next((i for i, (p, _) in enumerate(ranked, 1)
                     if canonical(p, job.model.num_layers).key() == rec_key), None)

    chosen, label, emitted = None, "", None
    if emit_fmt:
        if emit_rank is not None:
            if emit_rank > len(ranked):
                raise UserError(f"--emit-rank {emit_rank}: only {len(ranked)} plans")
            chosen, label = ranked[emit_rank - 1][0], f"plan #{emit_rank}"
        else:
            chosen, label = rec.plan, "the recommended plan"
        from autoparallel_cp.emit import emit

        emitted = emit(job, chosen, emit_fmt)  # before any file is written: it may refuse
    # every search phase is done: write the outputs together (an interrupt before this line
    # leaves every existing output file as it was)
    write_outputs(status, solve_time, space, dicts, csv_path, json_path, note,
                  extra=[(emit_out, emitted.text)] if emitted is not None and emit_out else [])

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
    if wall_net:
        note.print("note: the wall-clock safety net (3x --time-limit + 30 s) stopped the "
                   "search, not its deterministic budget: on a less loaded machine the answer "
                   "may differ")
    out.print(report.plans_table(dicts, highlight=rec_rank, compare=True))
    best = dicts[0]
    out.print(Text("fastest:     ", style="bold") + Text(
        f"#1 {report.plan_label(best['plan'])}  step {report.fmt_time(step_of(best))}, "
        f"{report.fmt_count(best['throughput'].get('tokens_per_s_per_gpu'))} tok/s/GPU"))
    if rec_rank is not None:
        rd = dicts[rec_rank - 1]
        rec_text = f"#{rec_rank} {report.plan_label(rd['plan'])}"
    else:
        rd = report.plans_from([api.evaluate(job, rec.plan)])[0]
        rec_text = report.plan_label(rd["plan"])
    out.print(Text("recommended: ", style="bold green") + Text(
        f"{rec_text}  step {report.fmt_time(step_of(rd))}, "
        f"{report.fmt_count(rd['throughput'].get('tokens_per_s_per_gpu'))} tok/s/GPU, "
        f"mem {report.gib(report.needed_bytes(rd['memory']))} GiB "
        f"(simplest within {tolerance:.0%}, {rec.method})"))
    out.print("  " + rec.why())
    for line in uncertainty_lines(job, dicts, [p for p, _ in ranked]):
        out.print("  " + line)

    if emit_fmt and chosen is not None:
        emit_settings(job, chosen, emit_fmt, emit_out, out, note, label, written=emitted)


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
          emit_fmt: str | None, emit_rank: int | None, emit_out: str | None, quiet: bool,
          time_limit: float, workers: int | None) -> None:
    """The optimal and k best distinct plans, found by CP-SAT."""
    check_outputs(csv_path=csv_path, json_path=json_path, emit_out=emit_out)
    job = build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _run_search("solve", job, fix=fix, top_k=top_k, objective=objective, tolerance=tolerance,
                csv_path=csv_path, json_path=json_path, emit_fmt=emit_fmt,
                emit_rank=emit_rank, emit_out=emit_out, quiet=quiet, time_limit=time_limit,
                workers=workers)


@click.command("enumerate")
@job_options
@search_options
@guarded
def enumerate_cmd(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
                  global_batch: int, recipe: str, fix: str | None, top_k: int, objective: str,
                  tolerance: float, csv_path: str | None, json_path: str | None,
                  emit_fmt: str | None, emit_rank: int | None, emit_out: str | None,
                  quiet: bool) -> None:
    """The exhaustive reference search over the same space (for checking the solver)."""
    check_outputs(csv_path=csv_path, json_path=json_path, emit_out=emit_out)
    job = build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _run_search("enumerate", job, fix=fix, top_k=top_k, objective=objective,
                tolerance=tolerance, csv_path=csv_path, json_path=json_path,
                emit_fmt=emit_fmt, emit_rank=emit_rank, emit_out=emit_out, quiet=quiet)
