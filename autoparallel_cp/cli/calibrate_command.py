"""`ap-solve calibrate`: fit the cost model's calibration knobs to measured runs."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autoparallel_cp import outputs
from autoparallel_cp.cli.common import guarded
from autoparallel_cp.errors import UserError


@click.command()
@click.option("--runs", "runs_path", required=True, metavar="RUNS.csv",
              help="Measured runs, one per row (INTERFACE.md columns; microbenchmark rows of "
                   "`ap-solve measure` too).")
@click.option("--out", "out_path", required=True, metavar="CALIB.yaml",
              help="Write the calibration file here (atomically).")
@click.option("--model", "-m", default=None, metavar="M", help="Model of rows without one.")
@click.option("--cluster", "-c", default=None, metavar="C", help="Cluster of rows without one.")
@click.option("--recipe", default=None, metavar="R|FILE",
              help="Recipe of rows without one (default megatron-bf16).")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@guarded
def calibrate(runs_path: str, out_path: str, model: str | None, cluster: str | None,
              recipe: str | None, quiet: bool) -> None:
    """Fit the cost model's calibration knobs to measured runs of your cluster.

    Prints each knob with its uncertainty, which knobs the runs cannot identify, the
    residuals before and after, and outliers; writes CALIB.yaml for --calibration.
    """
    from autoparallel_cp.calibrate.files import dump, to_document
    from autoparallel_cp.calibrate.fit import fit
    from autoparallel_cp.calibrate.runs import load_runs

    out = Console(highlight=False, soft_wrap=True)
    note = Console(stderr=True, quiet=quiet, highlight=False)
    runs, micro = load_runs(runs_path, model=model, cluster=cluster, recipe=recipe)
    if not runs and not micro:
        raise UserError(f"{runs_path}: no usable rows")
    res = fit(runs, micro, progress=lambda s: note.print(s))
    doc = to_document(res, {"runs": runs_path, "model": model, "cluster": cluster,
                            "recipe": recipe})
    outputs.write_atomic(out_path, dump(doc))
    out.print(Text(f"calibration from {len(runs)} runs"
                   + (f" and {len(micro)} microbenchmark rows" if micro else ""), style="bold"))
    t = Table(show_header=True, header_style="bold")
    for h in ("knob", "value", "± 1 sd", "status"):
        t.add_column(h)
    for k in res.knobs:
        sd = "-" if k.std is None else f"{k.std:.3g}"
        status = ("fitted" if k.identified else "not identified (prior)" if k.std is None
                  else "weak")
        if "bound" in k.note:
            status += ", at bound"
        t.add_row(k.name, f"{k.value:.4g}", sd, status)
    out.print(t)
    for label, d in (("before", res.before), ("after", res.after)):
        parts = []
        if "step_mape_pct" in d:
            parts.append(f"step time MAPE {d['step_mape_pct']:.1f}% (signed "
                         f"{d['step_signed_pct']:+.1f}%, worst {d['step_worst_pct']:+.1f}%)")
        if "memory_mape_pct" in d:
            parts.append(f"peak memory MAPE {d['memory_mape_pct']:.1f}%")
        if "micro_mape_pct" in d:
            parts.append(f"microbenchmarks MAPE {d['micro_mape_pct']:.1f}%")
        out.print(f"residuals {label}: " + ", ".join(parts))
    cal = res.calibration
    if cal.time_interval is not None:
        out.print(f"prediction interval (80%) after calibration: step time "
                  f"{cal.time_interval.lo:+.1%} / {cal.time_interval.hi:+.1%} (log ratio)")
    for n in res.notes:
        out.print(f"note: {n}")
    note.print(f"wrote {out_path}")
