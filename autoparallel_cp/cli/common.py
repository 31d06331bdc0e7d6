"""What every `ap-solve` command shares: errors to exit codes, the job and search options,
the progress line, and writing outputs and launch settings."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import click
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from autoparallel_cp import api, outputs, report
from autoparallel_cp.cli.calibration_options import (
    apply_options,
    calibration_option,
    headroom_option,
    moe_imbalance_option,
    search_also_option,
)
from autoparallel_cp.cli.params import FiniteFloat
from autoparallel_cp.cli.progress import ProgressBar
from autoparallel_cp.cli.signals import exit_code as interrupt_exit_code
from autoparallel_cp.cli.signals import message as interrupt_message
from autoparallel_cp.cli.signals import stop_watcher
from autoparallel_cp.emit import EMIT_FORMATS, emit
from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.search.limits import check as check_interrupt
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.plan import Plan, PlanError

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TOLERANCE = 0.03


# --------------------------------------------------------------------------------------------
# errors -> exit codes
# --------------------------------------------------------------------------------------------


#: INTERFACE.md exit codes.
EXIT_OK, EXIT_INFEASIBLE, EXIT_BAD_INPUT, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: `whatif` only: a point's solve crashed or its worker was lost (after the retries); every row,
#: the failed ones included (status `failed`), is written.
EXIT_POINT_FAILED = 4


def say(message: str) -> None:
    """One line on stderr, whatever characters stderr can encode (a closed stderr takes it
    silently)."""
    with contextlib.suppress(OSError, ValueError):
        outputs.safe_stream(sys.stderr).write(message.rstrip("\n") + "\n")
        sys.stderr.flush()


def fail(message: str, code: int) -> NoReturn:
    say(f"ap-solve: error: {message}")
    sys.exit(code)


class Timeout(Exception):
    """No plan within the limit, infeasibility not proven: exit 3 (JSON status `timeout`)."""


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"field {loc!r}: {msg}" if loc else msg


def guarded(fn: F) -> F:
    """Map user errors to INTERFACE.md exit codes: 2 bad input, 1 infeasible (proven), 3 time-out
    (no plan, not proven infeasible), 130 interrupted (SIGINT), 143 terminated (SIGTERM); no
    traceback. While the command runs either signal stops CP-SAT at once (`signals`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with stop_watcher():
                return fn(*args, **kwargs)
        except InfeasibleError as exc:
            say("ap-solve: no feasible plan.")
            say(exc.explanation.rstrip())
            sys.exit(EXIT_INFEASIBLE)
        except Timeout as exc:
            fail(str(exc), EXIT_TIMEOUT)
        except (UserError, PlanError) as exc:
            fail(" ".join(str(exc).split("\n")), EXIT_BAD_INPUT)
        except ValidationError as exc:
            fail(_one_line(exc), EXIT_BAD_INPUT)
        except KeyboardInterrupt:
            say(f"ap-solve: {interrupt_message()} (no output file written)")
            sys.exit(interrupt_exit_code())

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# shared options
# --------------------------------------------------------------------------------------------


#: Bounds of the float options (physically meaningful ranges, so nothing overflows the solver's
#: integer models downstream): a tolerance of 1000% of the best step time; a day of solving.
MAX_TOLERANCE = 10.0
MAX_TIME_LIMIT_S = 86400.0

#: Upper bounds of the integer job options: far above any real training job, low enough that
#: every product the solver models form stays within int64 (the spec loaders bound the rest).
MAX_GPUS = 10**7
MAX_SEQ_LEN = 2**24
MAX_GLOBAL_BATCH = 2**24
MAX_TOP_K = 1000
MAX_WORKERS = 1024


def time_limit_option(fn: F) -> F:
    return click.option(
        "--time-limit", type=FiniteFloat(0.0, MAX_TIME_LIMIT_S, lo_open=True), default=10.0,
        show_default=True,
        help="Search budget in seconds, as CP-SAT deterministic time (2 deterministic s per "
             "second: the same answer on an idle or a busy machine); a wall-clock safety net "
             "of 3x + 30 s stops pathological runs, with a note.")(fn)


def job_options(fn: F) -> F:
    opts = [
        click.option("--model", "-m", required=True, metavar="M",
                     help="Model preset (`ap-solve models`), spec YAML/JSON, or HF config.json."),
        click.option("--cluster", "-c", required=True, metavar="C",
                     help="Cluster preset (see `ap-solve clusters`) or a cluster YAML."),
        click.option("--gpus", type=click.IntRange(min=1, max=MAX_GPUS), default=None,
                     help="Use the first N GPUs of the cluster (default: all)."),
        click.option("--nodes", type=click.IntRange(min=1, max=MAX_GPUS), default=None,
                     help="Use the first N nodes of the cluster."),
        click.option("--seq-len", type=click.IntRange(min=1, max=MAX_SEQ_LEN), default=4096,
                     show_default=True,
                     help="Sequence length (tokens)."),
        click.option("--global-batch", type=click.IntRange(min=1, max=MAX_GLOBAL_BATCH),
                     default=512,
                     show_default=True, help="Global batch (sequences per optimizer step)."),
        click.option("--recipe", default="megatron-bf16", metavar="R|FILE",
                     show_default=True,
                     help=f"Recipe preset ({', '.join(RECIPES)}) or a YAML/JSON recipe file: "
                          "precisions, optimizer and framework behaviour."),
        calibration_option,
        moe_imbalance_option,
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def search_options(fn: F) -> F:
    opts = [
        click.option("--fix", default=None, metavar="K=V,...",
                     help="Pin plan fields, e.g. --fix tp=8,sp=1."),
        click.option("--top-k", type=click.IntRange(min=1, max=MAX_TOP_K), default=5,
                     show_default=True,
                     help="Number of best distinct plans."),
        click.option("--objective", type=click.Choice(["throughput", "cost", "robust"]),
                     default="throughput", show_default=True,
                     help="throughput and cost rank by the predicted step time (the same "
                          "order on a fixed cluster); robust by the pessimistic one, every "
                          "calibration knob at the slow end of its 80% range (see the user "
                          "guide)."),
        click.option("--tolerance", type=FiniteFloat(0.0, MAX_TOLERANCE),
                     default=DEFAULT_TOLERANCE,
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
        click.option("--trace", "trace_path", default=None, metavar="FILE.json",
                     help="Write plan #1's predicted step (or --trace-rank's) as a Chrome "
                          "trace (open it in ui.perfetto.dev or chrome://tracing)."),
        click.option("--trace-rank", type=click.IntRange(min=1), default=1, show_default=True,
                     help="With --trace / --html: the plan of the table to trace."),
        click.option("--html", "html_path", default=None, metavar="FILE.html",
                     help="Write a self-contained HTML report (needs plotly: the `html` "
                          "extra)."),
        click.option("--quiet", "-q", is_flag=True,
                     help="No progress line or notes on stderr."),
        headroom_option,
        search_also_option,
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def build_job(model: str, cluster: str, gpus: int | None, nodes: int | None, seq_len: int,
               global_batch: int, recipe: str) -> Job:
    return apply_options(api.make_job(model, cluster, gpus=gpus, nodes=nodes, seq_len=seq_len,
                                      global_batch=global_batch, recipe=recipe))


def job_header(job: Job) -> str:
    groups = " + ".join(
        f"{g.num_nodes}x{g.gpus_per_node} {g.gpu.name}" for g in job.cluster.node_groups)
    rho = (f", MoE load imbalance {job.moe_load_imbalance:g}"
           if job.moe_load_imbalance != 1.0 else "")
    return (f"{job.model.name} on {job.num_gpus} GPUs ({groups}), seq {job.seq_len}, "
            f"global batch {job.global_batch}, {job.recipe.name}{rho}")


# --------------------------------------------------------------------------------------------
# progress line
# --------------------------------------------------------------------------------------------


#: The progress display of every command (cli/progress.py: rich's Progress on stderr).
ProgressLine = ProgressBar


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
    for k in ("stage_layers", "stage_groups", "chunk_layers"):
        if k in fields:
            fields[k] = tuple(fields[k])
    return Plan(**fields)


def step_of(d: Mapping[str, Any]) -> float:
    return float(d["time"]["step_s"])


def write_outputs(status: str, solve_time: float, space: Any, dicts: list[dict[str, Any]],
                   csv_path: str | None, json_path: str | None, note: Console,
                   extra: Sequence[tuple[str, str]] = (),
                   space_desc: Mapping[str, Any] | None = None) -> None:
    """Write the CSV, the JSON and `extra` (path, text) together, after every search phase
    (`space_desc`: the JSON's `space`, `SearchSpace.describe`)."""
    items: list[tuple[str, str]] = []
    if csv_path:
        items.append((csv_path, outputs.plans_csv(dicts)))
    if json_path:
        items.append((json_path, outputs.result_json(status, solve_time, space, dicts,
                                                     space=space_desc)))
    check_interrupt()  # a Ctrl-C that came while the solver returned: write nothing
    outputs.write_all(items + list(extra))
    for path, _ in items:
        if path != "-":
            note.print(f"wrote {path}")


def check_outputs(inputs: Mapping[str, str | Sequence[str] | None] | None = None,
                  **paths: str | None) -> None:
    """The output rule (`outputs.check_paths`) before any work (exit 2): `paths` are the
    outputs by keyword (`json_path` is `--json`), `inputs` the files the command reads."""
    outputs.check_paths(
        inputs or {},
        {"--" + k.removesuffix("_path").replace("_", "-"): v for k, v in paths.items()})


def job_inputs(model: str | None, cluster: str | Sequence[str] | None,
               recipe: str | None = None) -> dict[str, str | Sequence[str] | None]:
    """The input files of a planning command: model, cluster(s), recipe, and the current
    command's --calibration file (presets name no file and are skipped by the rule)."""
    from autoparallel_cp.cli.calibration_options import calibration_path

    return {"--model": model, "--cluster": cluster, "--recipe": recipe,
            "--calibration": calibration_path()}


def emit_settings(job: Job, plan: Plan, fmt: str, out_path: str | None, out: Console,
          note: Console, label: str, *, written: Any = None) -> None:
    """Print (or write to `out_path`) the launch settings; `written`: an `emit` result whose
    file the caller already wrote with its other outputs."""
    e = written if written is not None else emit(job, plan, fmt)
    if out_path:
        if written is None:
            outputs.write_atomic(out_path, e.text)
        note.print(f"wrote {fmt} settings of {label} to {out_path}")
    else:
        out.print(Text(f"\n{fmt} settings of {label}:", style="bold"))
        out.print(e.text, markup=False, highlight=False, soft_wrap=True)
    for n in e.notes:
        note.print(f"note ({fmt}): {n}")


def consoles(json_path: str | None, quiet: bool, *others: str | None
             ) -> tuple[Console, Console]:
    """(report console, notes console): the report leaves stdout when JSON (or another
    output in `others`: --trace, --html) goes there."""
    if any(outputs.is_stdout(p) for p in (json_path, *others)):
        return report.stderr_console(quiet), report.stderr_console(quiet)
    return report.stdout_console(), report.stderr_console(quiet)
