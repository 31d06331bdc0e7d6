"""`--calibration FILE`, `--mem-headroom FRACTION` and `--moe-load-imbalance RHO`, shared by
the planning commands.

The options record their values on the click context (`expose_value=False`), and
`common.build_job` applies them through `apply_options`, so no command signature changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from autoparallel_cp.cli.params import FiniteFloat
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import Job

F = TypeVar("F", bound=Callable[..., Any])

_META_CAL = "ap_solve_calibration"
_META_HEADROOM = "ap_solve_mem_headroom"
_META_RHO = "ap_solve_moe_load_imbalance"
_META_ALSO = "ap_solve_search_also"
#: the axes `--search-also` adds to the default search (spec/job.py `Job.search_also`)
SEARCH_ALSO = ("schedule", "offload")


def _store(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def cb(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        ctx.meta[key] = value
        return value
    return cb


def calibration_option(fn: F) -> F:
    """`--calibration FILE` (recorded on the click context; `apply_options` reads it)."""
    return click.option(
        "--calibration", default=None, metavar="FILE", expose_value=False,
        callback=_store(_META_CAL),
        help="Calibration file written by `ap-solve calibrate`: the cost model's knobs fitted "
             "to your cluster, and the prediction intervals of that fit.")(fn)


def headroom_option(fn: F) -> F:
    """`--mem-headroom FRACTION` (default from the model's measured memory error)."""
    from autoparallel_cp.cost.uncertainty import default_mem_headroom

    return click.option(
        "--mem-headroom", type=FiniteFloat(0.0, 0.5, hi_open=True), default=None,
        metavar="FRACTION", expose_value=False, callback=_store(_META_HEADROOM),
        help="Plans whose predicted need plus this fraction of GPU memory exceeds it are "
             "near capacity: solve and enumerate still return them, marked with their risk "
             "of running out of memory, and recommend a plan within the margin (default "
             f"{default_mem_headroom():g}: the model's 90th-percentile memory under-"
             "prediction, where the risk is 10%; 0 turns it off). evaluate, explain and "
             "whatif mark a plan the same way (memory.near_capacity, memory.oom_risk).")(fn)


def moe_imbalance_option(fn: F) -> F:
    """`--moe-load-imbalance RHO` (recorded on the click context; `apply_options` validates it
    against the model through `Job.with_moe_load_imbalance`)."""
    return click.option(
        "--moe-load-imbalance", type=float, default=None, metavar="RHO", expose_value=False,
        callback=_store(_META_RHO),
        help="MoE expert-load imbalance of your run: the most-loaded expert-parallel rank's "
             "routed tokens over the mean rank's, per MoE layer and micro-batch (from "
             "Megatron's tokens_per_expert; see the user guide). Scales the routed experts' "
             "GEMMs, copies, all-to-all bytes and activations. Default 1 (balanced).")(fn)


def search_also_option(fn: F) -> F:
    """`--search-also AXIS[,AXIS]` (recorded on the click context; `apply_options` checks the
    names and sets `Job.search_also`)."""
    return click.option(
        "--search-also", default=None, metavar="AXIS[,AXIS]", expose_value=False,
        callback=_store(_META_ALSO),
        help="Add plan axes to the default search: 'schedule' (the ZB-H1 and ZB-H2 "
             "zero-bubble schedules beside 1F1B and interleaved, where the framework runs "
             "them) and 'offload' (the share of optimizer states on the host: 0, 0.5, 1, where "
             "the cluster states its host). Each makes the proof cover more plans and takes "
             "longer (see the user guide); a value pinned with --fix is searched either way.")(fn)


def calibration_path() -> str | None:
    """The current command's --calibration file, if given (an input of the output rule)."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_META_CAL)


def apply_options(job: Job) -> Job:
    """The job with the current command's --calibration, --mem-headroom,
    --moe-load-imbalance and --search-also applied (each only where the command has the option)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return job
    also = ctx.meta.get(_META_ALSO)
    if also:
        names = tuple(dict.fromkeys(a.strip() for a in str(also).split(",") if a.strip()))
        bad = [a for a in names if a not in SEARCH_ALSO]
        if bad or not names:
            raise InputError(f"--search-also {also}: expected a comma-separated list of "
                             f"{', '.join(SEARCH_ALSO)}", field="--search-also")
        job = job.model_copy(update={"search_also": names})
    rho = ctx.meta.get(_META_RHO)
    if rho is not None:
        try:
            job = job.with_moe_load_imbalance(rho)
        except ValueError as exc:
            raise InputError(str(exc), field="--moe-load-imbalance") from None
    path = ctx.meta.get(_META_CAL)
    cal = None
    if path:
        from autoparallel_cp.calibrate.files import load_calibration

        cal = load_calibration(path)
    h = None
    if _META_HEADROOM in ctx.meta:
        from autoparallel_cp.cost.uncertainty import default_mem_headroom

        h = ctx.meta.get(_META_HEADROOM)
        h = default_mem_headroom() if h is None else float(h)
    return job.calibrated(cal, h)


def calibration_scope(job: Job) -> tuple[list[str], list[str]]:
    """(what the job's calibration changes, e.g. "compute H100-SXM5-80GB x0.93"; the knobs in
    it that do not apply to this job, each with why)."""
    cal = job.calibration
    if cal is None:
        return [], []
    gpus = list(dict.fromkeys(g.gpu.name for g in job.cluster.node_groups))
    applied: list[str] = []
    skipped: list[str] = []
    for name, v in cal.compute.items():
        if name not in gpus:
            skipped.append(f"compute for {name[:80]} (this job's GPUs: {', '.join(gpus)})")
        elif v != 1.0:
            applied.append(f"compute {name} x{v:.4g}")
    multi_node = sum(g.num_nodes for g in job.cluster.node_groups) > 1
    for k, label in (("net_intra", "NVLink"), ("net_inter", "network")):
        v = float(getattr(cal, k))
        if v == 1.0:
            continue
        if k == "net_inter" and not multi_node:
            skipped.append(f"net_inter x{v:.4g} (the job fits in one node)")
        else:
            applied.append(f"{label} x{v:.4g}")
    for k, unit, scale in (("per_microbatch_s", "ms per micro-batch", 1e3),
                           ("per_step_s", "s per step", 1.0),
                           ("memory_reserve_gib", "GiB reserve", 1.0)):
        v = float(getattr(cal, k))
        if v:
            applied.append(f"+{v * scale:.4g} {unit}")
    if cal.time_interval is not None or cal.memory_interval is not None:
        applied.append("intervals from the fit")
    return applied, skipped


def uncertainty_lines(job: Job, dicts: list[dict[str, Any]], plans: list[Any],
                      top: int = 5) -> list[str]:
    """The near-tie and sensitivity lines printed under a solve / enumerate recommendation."""
    from autoparallel_cp.calibrate.advice import near_tie_line, sensitivity
    from autoparallel_cp.search.recommend import complexity

    by_rank = {id(d): p for d, p in zip(dicts, plans, strict=True)}
    out = []
    near = [i for i, d in enumerate(dicts, 1) if d.get("memory", {}).get("near_capacity")]
    if near:
        ranks = ", ".join(f"#{i}" for i in near)
        out.append(f"near capacity (!): {ranks} need more than {1 - job.mem_headroom:.1%} of "
                   f"GPU memory (--mem-headroom {job.mem_headroom:g}); ! gives the risk of "
                   "running out of memory; the recommendation avoids them")
    from autoparallel_cp.cost.evidence import evidence_text

    beyond = [i for i, d in enumerate(dicts, 1)
              if (d.get("evidence") or {}).get("beyond_evidence")]
    if beyond:
        d = dicts[beyond[0] - 1]
        also = ", ".join(f"#{i}" for i in beyond[1:])
        out.append(f"beyond the evidence (*): #{beyond[0]} "
                   + evidence_text(d["evidence"], float(d["throughput"].get("mfu") or 0))
                   + (f" ({also} too: JSON evidence)" if also else ""))
    if job.calibration is not None:
        applied, skipped = calibration_scope(job)
        if applied:
            out.append("calibrated (--calibration): " + ", ".join(applied))
        else:
            out.append("--calibration changes nothing for this job: every knob in it is at "
                       "its identity or does not apply")
        if skipped:
            out.append("--calibration knobs not applied: " + "; ".join(skipped))
    line = near_tie_line(dicts, lambda d: complexity(by_rank[id(d)]))
    if line:
        out.append(line)
    sens = sensitivity(job, plans[:top])
    if sens:
        out.append(f"sensitivity of #1 among the top {min(top, len(plans))} (each knob at its "
                   "80% range ends):")
        out += ["  " + s for s in sens]
    return out


def explain_sensitivity_lines(job: Job, plan: Any, current_step: float,
                              changes: list[Any]) -> list[str]:
    """`explain`: the plan and its best single changes re-ranked with each knob at its 80%
    range ends: is the fastest of them still the fastest?"""
    from autoparallel_cp.calibrate.advice import sensitivity

    cands = sorted([(current_step, "this plan", plan)]
                   + [(c.step_s, c.change, c.plan) for c in changes[:4]],
                   key=lambda t: t[0])
    lines = sensitivity(job, [c[2] for c in cands], labels=[c[1] for c in cands])
    if not lines:
        return []
    return [f"sensitivity (this plan and its best single changes, each knob at its 80% range "
            f"ends; fastest now: {cands[0][1]}):"] + ["  " + s for s in lines]
