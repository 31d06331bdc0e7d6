"""`ap-solve`: the command line of INTERFACE.md.

Exit codes: 0 success; 1 no feasible plan (explanation on stderr); 2 bad input (one line naming
the file / field on stderr). A user's mistake never shows a Python traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autoparallel_cp import __version__, api, report
from autoparallel_cp.emit import EMIT_FORMATS, emit
from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.plan import Plan, PlanError

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TOLERANCE = 0.03


# --------------------------------------------------------------------------------------------
# errors -> exit codes
# --------------------------------------------------------------------------------------------


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"ap-solve: error: {message}", err=True)
    sys.exit(code)


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"field {loc!r}: {msg}" if loc else msg


def guarded(fn: F) -> F:
    """Map user errors to INTERFACE.md exit codes: 2 bad input, 1 infeasible; no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InfeasibleError as exc:
            click.echo("ap-solve: no feasible plan.", err=True)
            click.echo(exc.explanation.rstrip(), err=True)
            sys.exit(1)
        except (UserError, PlanError) as exc:
            _fail(" ".join(str(exc).split("\n")), 2)
        except ValidationError as exc:
            _fail(_one_line(exc), 2)
        except KeyboardInterrupt:
            click.echo("ap-solve: interrupted", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# shared options
# --------------------------------------------------------------------------------------------


def _job_options(fn: F) -> F:
    opts = [
        click.option("--model", "-m", required=True, metavar="M",
                     help="Model preset (`ap-solve models`), spec YAML/JSON, or HF config.json."),
        click.option("--cluster", "-c", required=True, metavar="C",
                     help="Cluster preset (see `ap-solve clusters`) or a cluster YAML."),
        click.option("--gpus", type=click.IntRange(min=1), default=None,
                     help="Use the first N GPUs of the cluster (default: all)."),
        click.option("--nodes", type=click.IntRange(min=1), default=None,
                     help="Use the first N nodes of the cluster."),
        click.option("--seq-len", type=click.IntRange(min=1), default=4096, show_default=True,
                     help="Sequence length (tokens)."),
        click.option("--global-batch", type=click.IntRange(min=1), default=512,
                     show_default=True, help="Global batch (sequences per optimizer step)."),
        click.option("--recipe", default="megatron-bf16", metavar="R|FILE",
                     show_default=True,
                     help=f"Recipe preset ({', '.join(RECIPES)}) or a YAML/JSON recipe file: "
                          "precisions, optimizer and framework behaviour."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _search_options(fn: F) -> F:
    opts = [
        click.option("--fix", default=None, metavar="K=V,...",
                     help="Pin plan fields, e.g. --fix tp=8,sp=1."),
        click.option("--top-k", type=click.IntRange(min=1), default=5, show_default=True,
                     help="Number of best distinct plans."),
        click.option("--objective", type=click.Choice(["throughput", "cost"]),
                     default="throughput", show_default=True),
        click.option("--tolerance", type=click.FloatRange(min=0.0), default=DEFAULT_TOLERANCE,
                     show_default=True,
                     help="Recommend the simplest plan within this fraction of the best step "
                          "time."),
        click.option("--csv", "csv_path", default=None, metavar="FILE",
                     help="Write the plans as CSV (atomically)."),
        click.option("--json", "json_path", default=None, metavar="FILE|-",
                     help="Write the INTERFACE.md JSON; '-' for stdout."),
        click.option("--emit", "emit_fmt", type=click.Choice(EMIT_FORMATS), default=None,
                     help="Print launch settings of the recommended plan."),
        click.option("--emit-rank", type=click.IntRange(min=1), default=None,
                     help="With --emit: export plan #N of the table instead."),
        click.option("--emit-out", default=None, metavar="FILE",
                     help="With --emit: write the settings to FILE (atomically)."),
        click.option("--quiet", "-q", is_flag=True,
                     help="No progress line or notes on stderr."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _build_job(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
               global_batch: int, recipe: str) -> Job:
    return api.make_job(model, cluster, gpus=gpus, nodes=nodes, seq_len=seq_len,
                        global_batch=global_batch, recipe=recipe)


def _job_header(job: Job) -> str:
    groups = " + ".join(
        f"{g.num_nodes}x{g.gpus_per_node} {g.gpu.name}" for g in job.cluster.node_groups)
    return (f"{job.model.name} on {job.num_gpus} GPUs ({groups}), seq {job.seq_len}, "
            f"global batch {job.global_batch}, {job.recipe.name}")


# --------------------------------------------------------------------------------------------
# progress line
# --------------------------------------------------------------------------------------------


class ProgressLine:
    """A live line on stderr while CP-SAT improves its incumbent (only on a terminal)."""

    def __init__(self, enabled: bool, what: str = "solving") -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.what = what
        self._status: Any = None
        self._t0 = time.monotonic()
        self._n = 0

    def __enter__(self) -> ProgressLine:
        if self.enabled:
            self._status = Console(stderr=True).status(f"{self.what} ...")
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """Solver callback: accepts an objective value, a step time, or keyword fields."""
        self._n += 1
        if self._status is None:
            return
        detail = _progress_text(args, kwargs)
        self._status.update(f"{self.what} {time.monotonic() - self._t0:.1f} s, "
                            f"incumbent #{self._n}{': ' + detail if detail else ''}")


def _progress_text(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    parts = []
    fields = dict(kwargs)
    if args and isinstance(args[0], Mapping):
        fields.update(args[0])
    elif args:
        obj = args[0]
        for name in ("step_s", "objective", "best_bound", "gap", "plan"):
            if hasattr(obj, name):
                fields.setdefault(name, getattr(obj, name))
        if isinstance(obj, (int, float)):
            fields.setdefault("objective", obj)
    if fields.get("best_s") is not None:
        parts.append(f"best step {report.fmt_time(float(fields['best_s']))}")
    if fields.get("bound_s") is not None:
        parts.append(f"bound {report.fmt_time(float(fields['bound_s']))}")
    if fields.get("plans") is not None:
        parts.append(f"{fields['plans']} plans kept")
    if "step_s" in fields and fields["step_s"] is not None:
        parts.append(f"step {report.fmt_time(float(fields['step_s']))}")
    elif "objective" in fields and fields["objective"] is not None:
        parts.append(f"objective {fields['objective']}")
    if fields.get("gap") is not None:
        parts.append(f"gap {float(fields['gap']):.1%}")
    if isinstance(fields.get("plan"), Plan):
        parts.append(fields["plan"].short())
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------
# result helpers
# --------------------------------------------------------------------------------------------


def result_parts(result: Any) -> tuple[str, float, Any, list[Any]]:
    """(status, solve_time_s, space_size, evaluations) of a SolveResult."""
    status = str(getattr(result, "status", "feasible"))
    solve_time = float(getattr(result, "solve_time_s", 0.0) or 0.0)
    space = getattr(result, "space_size", None)
    plans = list(getattr(result, "plans", []) or [])
    return status, solve_time, space, plans


def plan_of(ev: Any) -> Plan:
    """The Plan of an Evaluation (or PLAN dict)."""
    p = getattr(ev, "plan", None)
    if isinstance(p, Plan):
        return p
    d = ev if isinstance(ev, Mapping) else ev.to_json()
    fields = {k: v for k, v in d["plan"].items() if v is not None}
    for k in ("stage_layers", "stage_groups"):
        if k in fields:
            fields[k] = tuple(fields[k])
    return Plan(**fields)


def step_of(d: Mapping[str, Any]) -> float:
    return float(d["time"]["step_s"])


def _write_outputs(status: str, solve_time: float, space: Any, dicts: list[dict[str, Any]],
                   csv_path: str | None, json_path: str | None, note: Console) -> None:
    if csv_path:
        report.write_atomic(csv_path, report.plans_csv(dicts))
        if csv_path != "-":
            note.print(f"wrote {csv_path}")
    if json_path:
        report.write_atomic(json_path, report.result_json(status, solve_time, space, dicts))
        if json_path != "-":
            note.print(f"wrote {json_path}")


def _emit(job: Job, plan: Plan, fmt: str, out_path: str | None, out: Console,
          note: Console, label: str) -> None:
    e = emit(job, plan, fmt)
    if out_path:
        report.write_atomic(out_path, e.text)
        note.print(f"wrote {fmt} settings of {label} to {out_path}")
    else:
        out.print(Text(f"\n{fmt} settings of {label}:", style="bold"))
        out.print(e.text, markup=False, highlight=False, soft_wrap=True)
    for n in e.notes:
        note.print(f"note ({fmt}): {n}")


def _consoles(json_path: str | None, quiet: bool) -> tuple[Console, Console]:
    """(report console, notes console): the report leaves stdout when JSON goes there."""
    if json_path == "-":
        return report.stderr_console(quiet), report.stderr_console(quiet)
    return report.stdout_console(), report.stderr_console(quiet)


# --------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ap-solve")
def main() -> None:
    """Find the fastest (and the simplest good) way to train a transformer on your GPUs.

    Data, tensor, pipeline (interleaved), context and expert parallelism, sequence parallelism,
    ZeRO, micro-batch size and activation recompute, chosen jointly by OR-Tools CP-SAT over an
    analytical memory and step-time model.
    """


def _run_search(kind: str, job: Job, *, fix: str | None, top_k: int, objective: str,
                 tolerance: float, csv_path: str | None, json_path: str | None,
                 emit_fmt: str | None, emit_rank: int | None, emit_out: str | None,
                 quiet: bool, time_limit: float | None = None,
                 workers: int | None = None) -> None:
    out, note = _consoles(json_path, quiet)
    if kind == "solve":
        with ProgressLine(not quiet, "CP-SAT") as progress:
            result = api.solve(job, top_k=top_k, time_limit=time_limit, workers=workers,
                               objective=objective, fix=fix, progress=progress)
    else:
        result = api.enumerate_plans(job, top_k=top_k, objective=objective, fix=fix)
    status, solve_time, space, evs = result_parts(result)
    dicts = report.plans_from(evs)
    _write_outputs(status, solve_time, space, dicts, csv_path, json_path, note)
    if not dicts:
        raise InfeasibleError(
            f"no plan found within the time limit ({solve_time:.1f} s; status {status}, not "
            "proven infeasible): raise --time-limit, or narrow the space with --fix")

    ranked = [(plan_of(ev), step_of(d)) for ev, d in zip(evs, dicts, strict=True)]
    from autoparallel_cp.search.recommend import recommend
    from autoparallel_cp.spec.plan import canonical

    with ProgressLine(not quiet, f"CP-SAT phase 2 (simplest within {tolerance:.0%})"):
        rec = recommend(job, ranked, tolerance, evaluations=evs, fix=fix,
                        time_limit=time_limit if time_limit is not None else 10.0,
                        workers=workers)
    rec_key = canonical(rec.plan, job.model.num_layers).key()
    rec_rank = next((i for i, (p, _) in enumerate(ranked, 1)
                     if canonical(p, job.model.num_layers).key() == rec_key), None)

    out.print(Text(_job_header(job), style="bold"))
    space_txt = (f"{space:.2g}" if isinstance(space, int) and space >= 10**9 else
                 f"{space:,}" if isinstance(space, int) else str(space))
    gap = getattr(result, "gap", None)
    if status == "optimal":
        proof = " (proven)"
    elif isinstance(gap, float) and gap > 0:
        proof = f" (time limit hit, gap {gap:.2%}: raise --time-limit)"
    else:
        proof = " (time limit hit before the proof: raise --time-limit)"
    out.print(f"{kind}: status {status}{proof}, {solve_time:.2f} s, space {space_txt} plans, "
              f"objective {objective}")
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

    if emit_fmt:
        if emit_rank is not None:
            if emit_rank > len(ranked):
                raise UserError(f"--emit-rank {emit_rank}: only {len(ranked)} plans")
            chosen, label = ranked[emit_rank - 1][0], f"plan #{emit_rank}"
        else:
            chosen, label = rec.plan, "the recommended plan"
        _emit(job, chosen, emit_fmt, emit_out, out, note, label)


@main.command()
@_job_options
@_search_options
@click.option("--time-limit", type=click.FloatRange(min=0.0, min_open=True), default=10.0,
              show_default=True, help="CP-SAT time limit in seconds.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="CP-SAT workers (default: CPU count).")
@guarded
def solve(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
          global_batch: int, recipe: str, fix: str | None, top_k: int, objective: str,
          tolerance: float, csv_path: str | None, json_path: str | None,
          emit_fmt: str | None, emit_rank: int | None, emit_out: str | None, quiet: bool,
          time_limit: float, workers: int | None) -> None:
    """The optimal and k best distinct plans, found by CP-SAT."""
    job = _build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _run_search("solve", job, fix=fix, top_k=top_k, objective=objective, tolerance=tolerance,
                csv_path=csv_path, json_path=json_path, emit_fmt=emit_fmt,
                emit_rank=emit_rank, emit_out=emit_out, quiet=quiet, time_limit=time_limit,
                workers=workers)


@main.command("enumerate")
@_job_options
@_search_options
@guarded
def enumerate_cmd(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
                  global_batch: int, recipe: str, fix: str | None, top_k: int, objective: str,
                  tolerance: float, csv_path: str | None, json_path: str | None,
                  emit_fmt: str | None, emit_rank: int | None, emit_out: str | None,
                  quiet: bool) -> None:
    """The exhaustive reference search over the same space (for checking the solver)."""
    job = _build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _run_search("enumerate", job, fix=fix, top_k=top_k, objective=objective,
                tolerance=tolerance, csv_path=csv_path, json_path=json_path,
                emit_fmt=emit_fmt, emit_rank=emit_rank, emit_out=emit_out, quiet=quiet)


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
        click.option("--quiet", "-q", is_flag=True, help="No notes on stderr."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _evaluate_and_report(job: Job, plan_text: str, json_path: str | None,
                         emit_fmt: str | None, emit_out: str | None, quiet: bool,
                         explain: bool) -> None:
    out, note = _consoles(json_path, quiet)
    ev = api.evaluate(job, plan_text)
    d = report.plans_from([ev])[0]
    if json_path:
        report.write_atomic(json_path, report.plan_json(d))
        if json_path != "-":
            note.print(f"wrote {json_path}")
    out.print(Text(_job_header(job), style="bold"))
    report.print_plan_report(out, d, title="Plan breakdown" if not explain else "Explanation",
                             num_layers=job.model.num_layers, explain=explain)
    if explain:
        from autoparallel_cp.search.recommend import single_changes

        changes = single_changes(job, plan_of(ev), d)
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
            for ch in changes[:5]:
                table.add_row(ch.change, report.fmt_time(ch.step_s), f"{ch.delta:+.1%}",
                              f"{report.gib(ch.peak_bytes)}/{report.gib(ch.capacity_bytes)}")
            out.print(table)
        elif d.get("fits"):
            out.print("No single-axis change fits and is faster: the plan is locally optimal.")
    if emit_fmt:
        _emit(job, plan_of(ev), emit_fmt, emit_out, out, note, "this plan")


@main.command()
@_job_options
@_plan_options
@guarded
def evaluate(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
             global_batch: int, recipe: str, plan_text: str, json_path: str | None,
             emit_fmt: str | None, emit_out: str | None, quiet: bool) -> None:
    """The memory and time breakdown of one given plan (also when it does not fit)."""
    job = _build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _evaluate_and_report(job, plan_text, json_path, emit_fmt, emit_out, quiet, explain=False)


@main.command()
@_job_options
@_plan_options
@guarded
def explain(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
            global_batch: int, recipe: str, plan_text: str, json_path: str | None,
            emit_fmt: str | None, emit_out: str | None, quiet: bool) -> None:
    """Explain one plan: breakdown, what limits it, and the changes that would help most."""
    job = _build_job(model, cluster, gpus, nodes, seq_len, global_batch, recipe)
    _evaluate_and_report(job, plan_text, json_path, emit_fmt, emit_out, quiet, explain=True)


def _csv_list(kind: Callable[[str], Any], name: str) -> Callable[..., Any]:
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            return [kind(v.strip()) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list, got {value!r}",
                                     param_hint=name) from None
    return convert


@main.command()
@click.option("--model", "-m", required=True, metavar="M", help="Model preset or file.")
@click.option("--cluster", "-c", required=True, metavar="C[,C...]",
              help="Cluster preset(s) or file(s); several = a GPU-type sweep.")
@click.option("--gpus", callback=_csv_list(int, "--gpus"), default=None, metavar="N[,N...]",
              help="GPU counts to sweep.")
@click.option("--nodes", callback=_csv_list(int, "--nodes"), default=None, metavar="N[,N...]",
              help="Node counts to sweep.")
@click.option("--inter-node-gbps", callback=_csv_list(float, "--inter-node-gbps"), default=None,
              metavar="BW[,BW...]", help="Inter-node bandwidths (GB/s per GPU) to sweep.")
@click.option("--seq-len", callback=_csv_list(int, "--seq-len"), default="4096",
              show_default=True, metavar="S[,S...]", help="Sequence lengths to sweep.")
@click.option("--global-batch", callback=_csv_list(int, "--global-batch"), default="512",
              show_default=True, metavar="B[,B...]", help="Global batches to sweep.")
@click.option("--recipe", default="megatron-bf16", metavar="R|FILE", show_default=True,
              help=f"Recipe preset ({', '.join(RECIPES)}) or a YAML/JSON recipe file.")
@click.option("--fix", default=None, metavar="K=V,...", help="Pin plan fields at every point.")
@click.option("--objective", type=click.Choice(["throughput", "cost"]), default="throughput",
              show_default=True, help="What each point optimizes; cost also ranks the points.")
@click.option("--tokens", type=float, default=None, metavar="N",
              help="Tokens to train (e.g. 15e12): days to train and, with prices, cost.")
@click.option("--time-limit", type=click.FloatRange(min=0.0, min_open=True), default=10.0,
              show_default=True, help="CP-SAT time limit per point.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Points solved in parallel processes (default: CPU count).")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Write a PNG plot (needs matplotlib: the `plot` extra).")
@click.option("--csv", "csv_path", default=None, metavar="FILE", help="Write the sweep as CSV.")
@click.option("--json", "json_path", default=None, metavar="FILE|-",
              help="Write the sweep as JSON; '-' for stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or notes on stderr.")
@guarded
def whatif(model: str, cluster: str, gpus: list[int] | None, nodes: list[int] | None,
           inter_node_gbps: list[float] | None, seq_len: list[int], global_batch: list[int],
           recipe: str, fix: str | None, objective: str, tokens: float | None,
           time_limit: float, jobs: int | None, plot_path: str | None, csv_path: str | None,
           json_path: str | None, quiet: bool) -> None:
    """Hardware and job planning: sweep GPUs, GPU type, network, sequence length, batch."""
    from autoparallel_cp import whatif as wi

    out, note = _consoles(json_path, quiet)
    if plot_path:
        wi.require_matplotlib()
    if tokens is not None and tokens <= 0:
        raise UserError("--tokens must be positive")
    points = wi.build_points(
        model=model, clusters=[c.strip() for c in cluster.split(",") if c.strip()],
        gpus=gpus, nodes=nodes, inter_node_gbps=inter_node_gbps, seq_lens=seq_len,
        global_batches=global_batch, recipe=recipe)
    api.parse_fix(fix)  # validate once, before spawning workers
    with ProgressLine(not quiet, f"what-if, {len(points)} points"):
        rows = wi.run_sweep(points, fix=fix, objective=objective, time_limit=time_limit,
                            jobs=jobs, tokens=tokens)
    if csv_path:
        report.write_atomic(csv_path, wi.rows_csv(rows))
        note.print(f"wrote {csv_path}")
    if json_path:
        report.write_atomic(json_path, wi.rows_json(rows))
        if json_path != "-":
            note.print(f"wrote {json_path}")
    out.print(Text(f"what-if: {model}, {len(rows)} points, objective {objective}",
                   style="bold"))
    out.print(wi.rows_table(rows, tokens=tokens, objective=objective))
    for line in wi.summary_lines(rows, tokens=tokens, objective=objective):
        out.print(line)
    if plot_path:
        wi.plot(rows, plot_path, tokens=tokens)
        note.print(f"wrote {plot_path}")


@main.command()
@click.option("--json", "json_path", default=None, metavar="FILE|-",
              help="Write the catalog as JSON.")
@guarded
def models(json_path: str | None) -> None:
    """List the model presets."""
    from autoparallel_cp.spec.loaders import model_catalog

    rows = model_catalog()
    if json_path:
        import json

        report.write_atomic(json_path, json.dumps(rows, indent=2) + "\n")
        if json_path == "-":
            return
    table = Table(title="Model presets (--model NAME)", title_justify="left",
                  header_style="bold")
    for col, just in (("name", "left"), ("params", "right"), ("active", "right"),
                      ("layers", "right"), ("hidden", "right"), ("heads", "right"),
                      ("kv", "right"), ("attn", "left"), ("experts", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r["name"], f"{r['params_b']:g}B", f"{r['active_b']:g}B", str(r["layers"]),
            str(r["hidden"]), str(r["heads"]), str(r["kv_heads"] or "-"), r["attention"],
            f"{r['experts']} (top-{r['top_k']})" if r.get("experts") else "-")
    report.stdout_console().print(table)


@main.command()
@click.option("--json", "json_path", default=None, metavar="FILE|-",
              help="Write the catalog as JSON.")
@guarded
def clusters(json_path: str | None) -> None:
    """List the cluster presets."""
    from autoparallel_cp.spec.loaders import cluster_catalog

    rows = cluster_catalog()
    if json_path:
        import json

        report.write_atomic(json_path, json.dumps(rows, indent=2) + "\n")
        if json_path == "-":
            return
    table = Table(title="Cluster presets (--cluster NAME; --gpus/--nodes select a part)",
                  title_justify="left", header_style="bold")
    for col in ("name", "gpu", "GPUs", "nodes", "GPU/node", "mem GiB", "bf16 TF/s",
                "NVLink GB/s", "net GB/s/GPU"):
        table.add_column(col, justify="left" if col in ("name", "gpu") else "right")
    for r in rows:
        table.add_row(r["name"], str(r["gpu"]), str(r["gpus"]), str(r["nodes"]),
                      str(r["gpus_per_node"]), str(r["memory_gib"]), str(r["bf16_tflops"]),
                      str(r["intra_node_gbps"]), str(r["inter_node_gbps"]))
    report.stdout_console().print(table)


@main.command()
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@guarded
def validate(args: tuple[str, ...]) -> None:
    """Run the validation benchmark (benchmarks/validate.py) with ARGS."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = root / "benchmarks" / "validate.py"
    if not script.is_file():
        raise UserError(f"{script}: the validation benchmark is only in a source checkout")
    rc = subprocess.call([sys.executable, str(script), *args], cwd=root)
    sys.exit(rc)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name=os.path.basename(sys.argv[0]))
