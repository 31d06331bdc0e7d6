"""`ap-solve calibrate`: fit the cost model's calibration knobs to measured runs."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from autoparallel_cp import outputs
from autoparallel_cp.cli.common import check_outputs, guarded, say
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

    check_outputs({"--runs": runs_path, "--model": model, "--cluster": cluster,
                   "--recipe": recipe}, out_path=out_path)
    # the table leaves stdout when the calibration file goes there; both consoles write what
    # their stream can encode (PYTHONIOENCODING=ascii: "+/-" for the table's sign)
    to_stdout = outputs.is_stdout(out_path)
    out = Console(file=outputs.safe_stream(sys.stderr if to_stdout else sys.stdout),
                  highlight=False, soft_wrap=True)
    note = Console(file=outputs.safe_stream(sys.stderr), quiet=quiet, highlight=False)
    runs, micro = load_runs(runs_path, model=model, cluster=cluster, recipe=recipe)
    if not runs and not micro:
        raise UserError(f"{runs_path}: no usable rows")
    with _bar(quiet) as bar:
        res = fit(runs, micro, progress=lambda s: note.print(s), bar=bar)
    if all(k.std is None for k in res.knobs) and not any(
            "cross-validation" in k.note for k in res.knobs):
        raise UserError(f"{runs_path}: none of the {len(res.knobs)} knobs ("
                        f"{', '.join(k.name for k in res.knobs)}) is identified: no row's "
                        "predicted time depends on them measurably, so no calibration was "
                        "written (GEMM rows fit the compute knob when they are large enough "
                        "not to be launch-bound; collective rows need >= 2 processes; "
                        "training rows fit every knob)")
    doc = to_document(res, {"runs": runs_path, "model": model, "cluster": cluster,
                            "recipe": recipe})
    outputs.write_atomic(out_path, dump(doc))
    out.print(Text(f"calibration from {len(runs)} runs"
                   + (f" and {len(micro)} microbenchmark rows" if micro else ""), style="bold"))
    t = Table(show_header=True, header_style="bold")
    for h in ("knob", "value", "± 1 sd", "runs determine", "status"):
        t.add_column(h)
    for k in res.knobs:
        sd = "-" if k.std is None else f"{k.std:.3g}"
        status = ("fitted" if k.identified else
                  "prior (held-out runs: no better)" if "cross-validation" in k.note else
                  "not identified (prior)" if k.std is None else "weak")
        if "bound" in k.note:
            status += ", at bound"
        if "shrunk" in k.note:
            status += ", shrunk"
        det = "-" if k.determined is None else f"{k.determined:.0%}"
        t.add_row(k.name, f"{k.value:.4g}", sd, det, status)
    out.print(t)
    moved = [f"{k.name} {k.value:.4g}" for k in res.knobs if k.std is not None]
    kept = [k.name for k in res.knobs if k.std is None]
    out.print("moved: " + (", ".join(moved) or "none") + "; left at the prior: "
              + (", ".join(kept) or "none") + " (why: the notes below)")
    out.print(f"runs weighed with the model's per-configuration error {res.model_sigma:.1%} "
              "(beside 2% measurement noise); a knob moves only where the runs determine at "
              "least half of it (\"runs determine\": alone)")
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
    if "heldout_step_pct" in res.after:
        out.print(f"held-out runs (cross-validated within the runs): step time error "
                  f"{res.before['heldout_step_pct']:.1f}% with the shipped model, "
                  f"{res.after['heldout_step_pct']:.1f}% calibrated")
    if all(k.std is None for k in res.knobs):
        out.print("no knob moved: held-out runs are predicted best by the shipped model, so "
                  "the file keeps it (with the prediction intervals of these runs)")
    cal = res.calibration
    if cal.time_interval is not None:
        out.print(f"prediction interval (80%) after calibration: step time "
                  f"{cal.time_interval.lo:+.1%} / {cal.time_interval.hi:+.1%} (log ratio)")
    for n in res.notes:
        out.print(f"note: {n}")
    cpu_rows = [m.row for m in micro if (m.fields.get("device") or "").startswith("cpu")]
    if cpu_rows:
        out.print(f"note: {len(cpu_rows)} microbenchmark rows (first: row {cpu_rows[0]}) were "
                  "measured on a CPU (`measure --cpu`): the knobs they fit describe that CPU, "
                  "not the cluster's GPUs")
    if not to_stdout:
        note.print(f"wrote {out_path}")


@contextmanager
def _bar(quiet: bool) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar on stderr for the fit's cost-model evaluations: one row per stage
    (off with -q and when stderr is not a terminal)."""
    err = Console(file=outputs.safe_stream(sys.stderr))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=True,
                        disable=quiet or not err.is_terminal)
    tasks: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = progress.add_task(stage, total=total)
        progress.update(tasks[stage], completed=done, total=total)

    with progress:
        yield update


@click.command()
@click.option("--cluster", "-c", required=True, metavar="C",
              help="The cluster preset / YAML the measurements describe (rows name it).")
@click.option("--gpu", default=None, metavar="NAME",
              help="GPU type name in that cluster (default: its first node group's).")
@click.option("--out", "out_path", required=True, metavar="ROWS.csv",
              help="Write the microbenchmark rows here (rank 0; atomically, '-' for stdout).")
@click.option("--hidden", type=click.IntRange(min=1, max=65536), default=4096,
              show_default=True,
              help="Hidden size of the GEMM shapes (t x h x 4h, t x 4h x h, t x h x 3h).")
@click.option("--tokens", type=click.IntRange(min=1, max=1 << 20), default=4096,
              show_default=True, help="Tokens per GEMM (micro-batch x sequence length / TP).")
@click.option("--sizes", default="1048576,16777216,134217728", show_default=True,
              metavar="BYTES,...", help="Collective buffer sizes (nccl-tests convention).")
@click.option("--reps", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--world-size", type=click.IntRange(min=1), default=None,
              help="Without torchrun: spawn this many local processes (default 1).")
@click.option("--cpu", is_flag=True, help="gloo and float32 on the CPU (tests, no GPU).")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Without torchrun: the local rendezvous port (default: MASTER_PORT, else "
                   "29517).")
@click.option("--train-steps", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also time this many data-parallel training steps of a small decoder "
                   "(hidden --hidden) and write them as a training row.")
@click.option("--train-layers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--train-seq", type=click.IntRange(min=2), default=512, show_default=True)
@click.option("--train-mbs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--train-microbatches", type=click.IntRange(min=1), default=2,
              show_default=True)
@guarded
def measure(cluster: str, gpu: str | None, out_path: str, hidden: int, tokens: int, sizes: str,
            reps: int, world_size: int | None, cpu: bool, port: int | None, train_steps: int,
            train_layers: int, train_seq: int, train_mbs: int, train_microbatches: int) -> None:
    """Measure GEMM rates and collective bandwidths for `ap-solve calibrate` (needs torch:
    pip install 'autoparallel-cp[measure]'; run under torchrun on the cluster)."""
    # the output rule before anything is measured (a bad --out fails at once, not after); under
    # torchrun only rank 0 writes, so only its node needs the folder
    rank0 = os.environ.get("RANK", "0") == "0"
    if rank0:
        check_outputs({"--cluster": cluster}, out_path=out_path)
    if rank0 and train_steps and outputs.is_stream(out_path):
        raise UserError(f"--out {out_path}: with --train-steps the decoder's model spec is "
                        "written beside --out: give a file, not a stream")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError("ap-solve measure needs torch: pip install 'autoparallel-cp[measure]'") \
            from None
    from autoparallel_cp.calibrate.measure import (
        MAX_GEMM_BYTES,
        MAX_SIZE_BYTES,
        Settings,
        gemm_bytes,
        launch,
        run,
    )
    from autoparallel_cp.spec.loaders import load_cluster

    cl = load_cluster(cluster)
    names = [g.gpu.name for g in cl.node_groups]
    name = gpu or names[0]
    if name not in names:
        raise UserError(f"--gpu {name!r} is not in cluster {cluster!r} ({', '.join(names)})")
    try:
        size_list = tuple(int(x) for x in sizes.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--sizes: expected comma-separated byte counts, got {sizes!r}") \
            from None
    if not size_list or min(size_list) <= 0:
        raise UserError("--sizes: expected positive byte counts")
    if max(size_list) > MAX_SIZE_BYTES:
        raise UserError(f"--sizes: {max(size_list)} bytes is more than {MAX_SIZE_BYTES} (8 GiB, "
                        "nccl-tests' usual largest buffer)")
    if gemm_bytes(hidden, tokens) > MAX_GEMM_BYTES:
        raise UserError(f"--hidden {hidden} with --tokens {tokens}: the GEMM operands need "
                        f"{gemm_bytes(hidden, tokens) / 2**30:.1f} GiB, more than "
                        f"{MAX_GEMM_BYTES >> 30} GiB")
    world, per_node, rank, torchrun = launch(world_size, port)
    import torch

    if not cpu and not torch.cuda.is_available():
        raise UserError("no GPU visible to torch (torch.cuda.is_available() is False): "
                        "measure on the cluster's GPUs, or pass --cpu to measure this CPU "
                        "(its rows then say device=cpu)")
    if hidden % 64 and train_steps:
        raise UserError("--hidden must be a multiple of 64 with --train-steps (64-wide heads)")
    s = Settings(cluster=cluster, gpu=name, hidden=hidden, tokens=tokens, sizes=size_list,
                 reps=reps, cpu=cpu, train_steps=train_steps, train_layers=train_layers,
                 train_seq=train_seq, train_mbs=train_mbs,
                 train_microbatches=train_microbatches)
    run(s, out_path, world, per_node, rank, torchrun, port, write=outputs.write_atomic)
    if rank == 0:
        if not outputs.is_stdout(out_path):
            say(f"wrote {out_path}")
        if world == 1:
            click.echo("note: one process: GEMM rows only (they fit the compute knob); the "
                       "collectives need >= 2 processes (torchrun --nproc-per-node N, or "
                       "--world-size N)", err=True)
