"""What-if planning: solve a grid of jobs (GPU count, GPU type, network, sequence, batch).

Each point is an independent CP-SAT solve, run in parallel processes or as Ray tasks
(`sweep_backends`). With `tokens`, a point also gets the days to train that many tokens and, when
every node group of its cluster has a `price_per_gpu_hour`, the cost in USD. A point whose solve
crashed, or whose worker was lost after the retries, is a row with status `failed`.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from autoparallel_cp import api, outputs, report, sweep_backends
from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.search import capacity
from autoparallel_cp.spec import Job

SWEEP_KEYS: tuple[str, ...] = ("cluster", "gpus", "inter_node_gbps", "seq_len", "global_batch")
ROW_COLUMNS: tuple[str, ...] = SWEEP_KEYS + (
    "gpu", "net_gbps", "status", "plan", "step_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
    "peak_gib", "days", "cost_usd", "usd_per_hour", "explanation",
    # the job's stated MoE load imbalance (--moe-load-imbalance; 1 = balanced), echoed
    "moe_load_imbalance",
    # the best plan above the --mem-headroom margin (search/capacity.py) and its chance of
    # running out of memory (cost/uncertainty.py), as solve marks its plans
    "near_capacity", "oom_risk",
)


def require_matplotlib() -> None:
    """Fail early (exit 2) when matplotlib, the `plot` extra, is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install 'autoparallel-cp[plot]'") from None


@dataclass(frozen=True)
class Point:
    """One what-if point: its sweep coordinates and the job to solve."""

    coords: dict[str, Any]
    job: Job


def build_points(
    *,
    model: str,
    clusters: Sequence[str],
    gpus: Sequence[int] | None = None,
    nodes: Sequence[int] | None = None,
    inter_node_gbps: Sequence[float] | None = None,
    seq_lens: Sequence[int] = (4096,),
    global_batches: Sequence[int] = (512,),
    recipe: str = "megatron-bf16",
) -> list[Point]:
    """The cartesian product of the sweep values, as jobs (inputs validated here, exit 2)."""
    if gpus and nodes:
        raise UserError("give --gpus or --nodes, not both")
    if not clusters:
        raise UserError("--cluster: give at least one cluster")
    m = api.load_model(model)
    cl = {c: api.load_cluster(c) for c in dict.fromkeys(clusters)}
    rec = api.resolve_recipe(recipe)
    sizes: list[tuple[str, int | None]] = (
        [("gpus", g) for g in gpus] if gpus else
        [("nodes", n) for n in nodes] if nodes else [("gpus", None)])
    bws: list[float | None] = list(inter_node_gbps) if inter_node_gbps else [None]
    points: list[Point] = []
    for cname, (kind, n), bw, s, b in itertools.product(
            cl, sizes, bws, seq_lens, global_batches):
        c = api.select_gpus(cl[cname], n if kind == "gpus" else None,
                            n if kind == "nodes" else None)
        if bw is not None:
            c = api.with_inter_node_bandwidth(c, bw)
        job = api.make_job(m, c, seq_len=s, global_batch=b, recipe=rec)
        coords = {"cluster": cname, "gpus": job.num_gpus, "inter_node_gbps": bw,
                  "seq_len": s, "global_batch": b}
        points.append(Point(coords, job))
    return points


def _bw(job: Job) -> Any:
    # the nominal bandwidth: a calibration (--calibration) scales the job's links
    f = job.calibration.net_inter if job.calibration is not None else 1.0
    vals = list(dict.fromkeys(round(g.inter_node.bandwidth_gbps / f, 6)
                              for g in job.cluster.node_groups))
    return vals[0] if len(vals) == 1 else "/".join(map(str, vals))


def _solve_point(job: Job, fix: str | None, objective: str, time_limit: float,
                 workers: int) -> dict[str, Any]:
    """Worker: the best plan of one point, or why there is none. As `solve` does, the search
    admits every plan that fits the GPU's whole memory, and a plan above the `--mem-headroom`
    margin is kept and marked (`memory.near_capacity`, `memory.oom_risk`: search/capacity.py),
    not cut."""
    full_job, headroom = capacity.to_capacity(job)
    try:
        res = api.solve(full_job, top_k=1, time_limit=time_limit, workers=workers,
                        objective=objective, fix=fix)
    except InfeasibleError as exc:
        return {"status": "infeasible", "explanation": exc.explanation.strip()}
    except UserError as exc:
        return {"status": "error", "explanation": str(exc)}
    plans = report.plans_from(getattr(res, "plans", []) or [])
    capacity.annotate(plans, headroom)
    if not plans:
        return {"status": "timeout",
                "explanation": "no plan found within the time limit (not proven infeasible)"}
    return {"status": str(getattr(res, "status", "feasible")), "best": plans[0]}


def run_sweep(points: Sequence[Point], *, fix: str | None = None, objective: str = "throughput",
              time_limit: float = 10.0, jobs: int | None = None,
              tokens: float | None = None, backend: str = "local", address: str | None = None,
              on_done: sweep_backends.OnDone | None = None) -> list[dict[str, Any]]:
    """Solve every point (`jobs` at once, on `backend`: `sweep_backends.run_tasks`) and return
    one row per point, in the order of `points`."""
    # one CP-SAT worker per point: the deterministic budget then gives the same answer however
    # many points run at once, on whichever machine, however loaded (search/limits.py)
    args = [(p.job, fix, objective, time_limit, 1) for p in points]
    outs = sweep_backends.run_tasks(_solve_point, args, backend=backend, jobs=jobs,
                                    address=address, on_done=on_done)
    return [_row(p, _failed(o) if isinstance(o, sweep_backends.TaskFailure) else o, tokens)
            for p, o in zip(points, outs, strict=True)]


def _failed(failure: sweep_backends.TaskFailure) -> dict[str, Any]:
    return {"status": "failed", "explanation": f"the point's solve failed: {failure.message}"}


def failed_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose solve crashed or was lost (not infeasible, not a time-out)."""
    return [r for r in rows if r["status"] == "failed"]


def point_label(row: dict[str, Any]) -> str:
    """`cluster, N GPUs, seq S, batch B` (and the swept bandwidth) of a row."""
    bw = "" if row["inter_node_gbps"] is None else f", net {row['inter_node_gbps']} GB/s"
    return (f"{row['cluster']}, {row['gpus']} GPUs{bw}, seq {row['seq_len']}, "
            f"batch {row['global_batch']}")


def _row(point: Point, out: dict[str, Any], tokens: float | None) -> dict[str, Any]:
    job = point.job
    row: dict[str, Any] = dict(point.coords)
    row["gpu"] = "/".join(dict.fromkeys(g.gpu.name for g in job.cluster.node_groups))
    row["net_gbps"] = _bw(job)
    row["status"] = out["status"]
    row["usd_per_hour"] = api.cluster_price_per_hour(job.cluster)
    row["moe_load_imbalance"] = job.moe_load_imbalance
    best = out.get("best")
    for k in ("plan", "step_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "peak_gib",
              "days", "cost_usd", "near_capacity", "oom_risk"):
        row[k] = None
    row["explanation"] = out.get("explanation")
    if best is not None:
        row["plan"] = best["plan"]
        row["step_s"] = best["time"]["step_s"]
        thr = best.get("throughput", {})
        row["tokens_per_s"] = thr.get("tokens_per_s")
        row["tokens_per_s_per_gpu"] = thr.get("tokens_per_s_per_gpu")
        row["mfu"] = thr.get("mfu")
        mem = best.get("memory", {})
        peak = mem.get("peak_bytes")
        row["peak_gib"] = round(peak / report.GIB, 2) if peak is not None else None
        row["near_capacity"] = mem.get("near_capacity")
        row["oom_risk"] = mem.get("oom_risk")
        if tokens and row["tokens_per_s"]:
            hours = tokens / row["tokens_per_s"] / 3600.0
            row["days"] = hours / 24.0
            if row["usd_per_hour"] is not None:
                row["cost_usd"] = hours * row["usd_per_hour"]
    return row


def swept(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The sweep keys that take more than one value (a cluster's own bandwidth is not swept)."""
    return [k for k in SWEEP_KEYS if len({str(r[k]) for r in rows}) > 1]


def rows_table(rows: Sequence[dict[str, Any]], *, tokens: float | None = None,
               objective: str = "throughput") -> Table:
    """The sweep as a rich table."""
    t = Table(header_style="bold")
    for col in ("cluster", "gpus", "net GB/s", "seq", "batch"):
        t.add_column(col, justify="left" if col == "cluster" else "right")
    t.add_column("best plan")
    t.add_column("step", justify="right")
    t.add_column("tok/s/GPU", justify="right")
    t.add_column("MFU", justify="right")
    t.add_column("mem GiB", justify="right")
    if tokens:
        t.add_column("days", justify="right")
        t.add_column("cost $", justify="right")
    best_i = _best_index(rows, objective)
    for i, r in enumerate(rows):
        plan = report.plan_label(r["plan"]) if r["plan"] else r["status"]
        cells = [str(r["cluster"]), str(r["gpus"]), str(r["net_gbps"]),
                 str(r["seq_len"]), str(r["global_batch"]), plan,
                 report.fmt_time(r["step_s"]), report.fmt_count(r["tokens_per_s_per_gpu"]),
                 "-" if r["mfu"] is None else f"{r['mfu']:.1%}",
                 "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}" + (
                     " " + capacity.risk_text({"memory": {"near_capacity": True,
                                                          "oom_risk": r.get("oom_risk")}})
                     if r.get("near_capacity") else "")]
        if tokens:
            cells.append("-" if r["days"] is None else f"{r['days']:.1f}")
            cells.append("-" if r["cost_usd"] is None else f"{r['cost_usd']:,.0f}")
        t.add_row(*cells, style="bold green" if i == best_i else None)
    return t


def _best_index(rows: Sequence[dict[str, Any]], objective: str) -> int | None:
    ok = [(i, r) for i, r in enumerate(rows) if r["tokens_per_s"]]
    if not ok:
        return None
    if objective == "cost":
        priced = [(i, r) for i, r in ok if r["usd_per_hour"] is not None]
        if priced:
            # cost per token = USD/hour / tokens per hour
            return min(priced, key=lambda ir: ir[1]["usd_per_hour"] / ir[1]["tokens_per_s"])[0]
    return max(ok, key=lambda ir: ir[1]["tokens_per_s"])[0]


def summary_lines(rows: Sequence[dict[str, Any]], *, tokens: float | None = None,
                  objective: str = "throughput") -> list[str]:
    """A few sentences: the best point and the infeasible ones."""
    out: list[str] = []
    i = _best_index(rows, objective)
    if i is not None:
        r = rows[i]
        what = "cheapest per token" if objective == "cost" and r["usd_per_hour"] else "fastest"
        line = (f"{what}: {r['cluster']}, {r['gpus']} GPUs, seq {r['seq_len']}, batch "
                f"{r['global_batch']}: {report.fmt_count(r['tokens_per_s'])} tokens/s")
        if r["days"] is not None:
            line += f", {r['days']:.1f} days"
        if r["cost_usd"] is not None:
            line += f", ${r['cost_usd']:,.0f}"
        out.append(line)
    if tokens and any(r["usd_per_hour"] is None for r in rows):
        out.append("cost: add price_per_gpu_hour to the cluster file's node groups")
    for r in rows:
        if r["status"] in ("infeasible", "error", "timeout", "failed"):
            first = (r["explanation"] or "").splitlines()[0] if r["explanation"] else ""
            out.append(f"{r['status']}: {point_label(r)}: {first}")
    return out


def rows_csv(rows: Sequence[dict[str, Any]]) -> str:
    """The sweep as CSV (the plan as its `key=value` text)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(ROW_COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        d = dict(r)
        if d["plan"]:
            d["plan"] = ",".join(f"{k}={v}" for k, v in d["plan"].items() if v is not None)
        w.writerow({k: d.get(k) for k in ROW_COLUMNS})
    return buf.getvalue()


def rows_json(rows: Sequence[dict[str, Any]]) -> str:
    """The sweep as JSON: {"points": [row, ...]}."""
    return json.dumps({"points": [dict(r) for r in rows]}, indent=2) + "\n"


def plot(rows: Sequence[dict[str, Any]], path: str, *, tokens: float | None = None) -> None:
    """Write `plot_png` to `path` by the output rule (`outputs.write_atomic`: a regular file is
    replaced atomically; `-`, a FIFO or a character device is streamed to; a symlink is
    followed)."""
    outputs.write_atomic(path, plot_png(rows, tokens=tokens))


def plot_png(rows: Sequence[dict[str, Any]], *, tokens: float | None = None) -> bytes:
    """PNG of tokens/s/GPU, MFU and time to train (or step time) over the sweep."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator, PercentFormatter

    keys = swept(rows)
    x_key = next((k for k in keys if k != "cluster"), keys[0] if keys else "gpus")
    series_keys = [k for k in keys if k != x_key]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        name = ", ".join(f"{k}={r[k]}" for k in series_keys) or str(r["cluster"])
        groups.setdefault(name, []).append(r)
    third = ("days", "days to train") if tokens else ("step_s", "step time (s)")
    panels = [("tokens_per_s_per_gpu", "tokens/s per GPU"), ("mfu", "MFU"), third]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    numeric_x = all(isinstance(r[x_key], (int, float)) for r in rows)
    for ax, (field, label) in zip(axes, panels, strict=True):
        for name, rs in groups.items():
            pts = [(r[x_key], r[field]) for r in rs if r[field] is not None]
            if not pts:
                continue
            xs = [p[0] if numeric_x else str(p[0]) for p in pts]
            ax.plot(xs, [p[1] for p in pts], marker="o", label=name)
        ax.set_xlabel(x_key.replace("_", " "))
        ax.set_ylabel(label)
        if numeric_x and x_key in ("gpus", "seq_len", "global_batch"):
            ax.set_xscale("log", base=2)
            ticks = sorted({r[x_key] for r in rows})
            ax.set_xticks(ticks, [str(x) for x in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
        if field == "mfu":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("ap-solve what-if: best plan per point")
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=120)
    finally:
        plt.close(fig)
    return buf.getvalue()
