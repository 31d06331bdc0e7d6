"""`ap-solve whatif`: sweeps over GPU count, type, network, sequence length and batch."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.text import Text

from autoparallel_cp import api, outputs, sweep_backends
from autoparallel_cp.cli.calibration_options import (
    apply_options,
    calibration_option,
    headroom_option,
    moe_imbalance_option,
)
from autoparallel_cp.cli.common import (
    EXIT_POINT_FAILED,
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_SEQ_LEN,
    MAX_WORKERS,
    FiniteFloat,
    ProgressLine,
    check_interrupt,
    check_outputs,
    consoles,
    guarded,
    job_inputs,
    say,
    time_limit_option,
)
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import RECIPES

#: Bounds of whatif's own options: 100 TB/s per GPU of network; 10^16 tokens (1000x the largest
#: published pre-training runs, ~15e12 tokens for Llama 3).
MAX_GBPS = 1e5
MAX_TOKENS = 1e16


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _csv_list(kind: Callable[[str], Any], name: str, lo: float, hi: float
              ) -> Callable[..., Any]:
    """A comma-separated list of `kind` values, each finite and in [lo, hi] (exit 2 if not)."""
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            vals = [kind(v.strip()) for v in value.split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list, got {value!r}",
                                     param_hint=name) from None
        if not vals:
            raise click.BadParameter("expected at least one value", param_hint=name)
        for v in vals:
            if not math.isfinite(v) or not lo <= v <= hi:
                raise click.BadParameter(
                    f"{v!r} is out of range: must be in [{_num(lo)}, {_num(hi)}]",
                    param_hint=name)
        return vals
    return convert


@click.command()
@click.option("--model", "-m", required=True, metavar="M", help="Model preset or file.")
@click.option("--cluster", "-c", required=True, metavar="C[,C...]",
              help="Cluster preset(s) or file(s); several = a GPU-type sweep.")
@click.option("--gpus", callback=_csv_list(int, "--gpus", 1, MAX_GPUS),
              default=None, metavar="N[,N...]",
              help="GPU counts to sweep.")
@click.option("--nodes", callback=_csv_list(int, "--nodes", 1, MAX_GPUS),
              default=None, metavar="N[,N...]",
              help="Node counts to sweep.")
@click.option("--inter-node-gbps", callback=_csv_list(float, "--inter-node-gbps", 1e-3, MAX_GBPS),
              default=None,
              metavar="BW[,BW...]", help="Inter-node bandwidths (GB/s per GPU) to sweep.")
@click.option("--seq-len", callback=_csv_list(int, "--seq-len", 1, MAX_SEQ_LEN), default="4096",
              show_default=True, metavar="S[,S...]", help="Sequence lengths to sweep.")
@click.option("--global-batch", callback=_csv_list(int, "--global-batch", 1, MAX_GLOBAL_BATCH),
              default="512",
              show_default=True, metavar="B[,B...]", help="Global batches to sweep.")
@click.option("--recipe", default="megatron-bf16", metavar="R|FILE", show_default=True,
              help=f"Recipe preset ({', '.join(RECIPES)}) or a YAML/JSON recipe file.")
@click.option("--fix", default=None, metavar="K=V,...", help="Pin plan fields at every point.")
@click.option("--objective", type=click.Choice(["throughput", "cost"]), default="throughput",
              show_default=True, help="What each point optimizes; cost also ranks the points.")
@click.option("--tokens", type=FiniteFloat(0.0, MAX_TOKENS, lo_open=True), default=None,
              metavar="N",
              help="Tokens to train (e.g. 15e12): days to train and, with prices, cost.")
@time_limit_option
@click.option("--jobs", "-j", type=click.IntRange(min=1, max=MAX_WORKERS), default=None,
              help="Points solved at once (default: CPU count): local processes, the CPUs of "
                   "a local Ray runtime, or with --address the Ray tasks in flight (default: "
                   "all, the cluster schedules them).")
@click.option("--backend", type=click.Choice(sweep_backends.BACKENDS), default="local",
              show_default=True,
              help="Where the points run: local processes, or Ray tasks (needs the `ray` "
                   "extra: pip install 'autoparallel-cp[ray]').")
@click.option("--address", default=None, metavar="ADDR",
              help="With --backend ray: the Ray cluster to use (host:port, auto or "
                   "ray://host:port, as ray.init reads it; default: $RAY_ADDRESS, else a "
                   "local Ray runtime started and stopped for this sweep).")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Write a PNG plot (needs matplotlib: the `plot` extra).")
@click.option("--html", "html_path", default=None, metavar="FILE.html",
              help="Write a self-contained HTML report with the sweep's curves (needs plotly: "
                   "the `html` extra).")
@click.option("--csv", "csv_path", default=None, metavar="FILE", help="Write the sweep as CSV.")
@click.option("--json", "json_path", default=None, metavar="FILE|-",
              help="Write the sweep as JSON; '-' for stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or notes on stderr.")
@calibration_option
@headroom_option
@moe_imbalance_option
@guarded
def whatif(model: str, cluster: str, gpus: list[int] | None, nodes: list[int] | None,
           inter_node_gbps: list[float] | None, seq_len: list[int], global_batch: list[int],
           recipe: str, fix: str | None, objective: str, tokens: float | None,
           time_limit: float, jobs: int | None, backend: str, address: str | None,
           plot_path: str | None, html_path: str | None, csv_path: str | None,
           json_path: str | None, quiet: bool) -> None:
    """Hardware and job planning: sweep GPUs, GPU type, network, sequence length, batch."""
    from autoparallel_cp import whatif as wi

    if address is not None and backend != "ray":
        raise UserError("--address: only with --backend ray")
    if backend == "ray":
        sweep_backends.require_ray()
    clusters = [c.strip() for c in cluster.split(",") if c.strip()]
    check_outputs(job_inputs(model, clusters, recipe), csv_path=csv_path, json_path=json_path,
                  plot_path=plot_path, html_path=html_path)
    out, note = consoles(json_path, quiet, csv_path, plot_path, html_path)
    if plot_path:
        wi.require_matplotlib()
    if html_path:
        from autoparallel_cp.html_report import require_plotly

        require_plotly()
    points = wi.build_points(
        model=model, clusters=clusters,
        gpus=gpus, nodes=nodes, inter_node_gbps=inter_node_gbps, seq_lens=seq_len,
        global_batches=global_batch, recipe=recipe)
    points = [dataclasses.replace(p, job=apply_options(p.job)) for p in points]
    api.parse_fix(fix)  # validate once, before spawning workers
    with ProgressLine(not quiet, "what-if points", total=len(points)) as progress:
        rows = wi.run_sweep(points, fix=fix, objective=objective, time_limit=time_limit,
                            jobs=jobs, tokens=tokens, backend=backend, address=address,
                            on_done=progress.done)
    items: list[tuple[str, str | bytes]] = (
        ([(csv_path, wi.rows_csv(rows))] if csv_path else [])
        + ([(json_path, wi.rows_json(rows))] if json_path else [])
        + ([(plot_path, wi.plot_png(rows, tokens=tokens))] if plot_path else []))
    if html_path:
        from autoparallel_cp.html_report import whatif_report

        keys = wi.swept(rows)
        x_key = next((k for k in keys if k != "cluster"), keys[0] if keys else "gpus")
        items.append((html_path, whatif_report(
            rows, title="ap-solve whatif",
            subtitle=f"{model}, {len(rows)} points, objective {objective}", x_key=x_key,
            series_keys=[k for k in keys if k != x_key],
            notes=wi.summary_lines(rows, tokens=tokens, objective=objective), tokens=tokens)))
    check_interrupt()
    outputs.write_all(items)  # together, before the report (a reader of stdout may go early)
    for path, _ in items:
        if path != "-":
            note.print(f"wrote {path}")
    out.print(Text(f"what-if: {model}, {len(rows)} points, objective {objective}",
                   style="bold"))
    out.print(wi.rows_table(rows, tokens=tokens, objective=objective))
    for line in wi.summary_lines(rows, tokens=tokens, objective=objective):
        out.print(line)
    failed = wi.failed_rows(rows)
    for r in failed:
        say(f"ap-solve: error: {wi.point_label(r)}: {r['explanation']}")
    if failed:
        say(f"ap-solve: {len(failed)} of {len(rows)} points failed (status 'failed' in the "
            "outputs)")
        sys.exit(EXIT_POINT_FAILED)
