"""Advice that survives the uncertainty: near-ties by prediction interval, and the sensitivity of
the winner to each calibration knob.

- Near-ties: plans whose nominal 80 % step-time interval overlaps the fastest plan's cannot be
  told apart by the model; among them the simplest (search/recommend.py complexity, passed in)
  and the one with the most memory margin are named.
- Sensitivity: the top plans are re-ranked with each knob at the ends of its 80 % range (the
  calibration's fitted uncertainty, else the prior width of calibrate/fit.py), one knob at a
  time, and the winner under each is reported ("stays best if the network is 30 % slower;
  loses to #3 if compute is 10 % faster").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autoparallel_cp.calibrate.prior import WEAK_PRIOR_SIGMA
from autoparallel_cp.calibrate.residuals import Z80
from autoparallel_cp.cost.steptime import step_time
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.calibration import Calibration
from autoparallel_cp.spec.plan import Plan


def near_ties(plans: Sequence[Mapping[str, Any]]) -> list[int]:
    """1-based ranks (after #1) whose step-time interval overlaps plan #1's."""
    if not plans:
        return []
    best = plans[0]["time"].get("step_s_interval")
    if not best:
        return []
    out = []
    for i, p in enumerate(plans[1:], start=2):
        iv = p["time"].get("step_s_interval")
        if iv and iv[0] <= best[1]:
            out.append(i)
    return out


def near_tie_line(plans: Sequence[Mapping[str, Any]],
                  complexity: Callable[[Mapping[str, Any]], int]) -> str | None:
    """One sentence on the near-ties of a ranked table (None when there are none)."""
    ties = near_ties(plans)
    if not ties:
        return None
    group = [1, *ties]
    simplest = min(group, key=lambda r: (complexity(plans[r - 1]), r))

    def margin(r: int) -> float:
        mem = plans[r - 1]["memory"]
        need = mem.get("required_bytes", mem.get("peak_bytes")) or 0.0
        cap = mem.get("capacity_bytes") or 1.0
        return 1.0 - float(need) / float(cap)

    roomiest = max(group, key=lambda r: (margin(r), -r))
    ranks = ", ".join(f"#{r}" for r in ties)
    return (f"near-ties: {ranks} {'is' if len(ties) == 1 else 'are'} within the model's 80% "
            f"uncertainty of #1 (step-time intervals overlap); among them #{simplest} is the "
            f"simplest and #{roomiest} leaves the most memory free ({margin(roomiest):.0%}).")


def knob_ranges(job: Job) -> dict[str, tuple[float, float]]:
    """Multipliers (compute, networks) or added seconds (per micro-batch) at the 80 % ends of
    each knob: the calibration's fitted one-sd uncertainty where it has one, else the weak
    prior (calibrate/prior.py WEAK_PRIOR_SIGMA: the ranges `--objective robust` was built and
    tested with; the corpus's spread across clusters, CORPUS_PRIOR_SIGMA, sets the fit's
    prior only)."""
    cal = job.calibration
    std = cal.std if cal is not None else {}
    out: dict[str, tuple[float, float]] = {}
    for g in dict.fromkeys(g.gpu.name for g in job.cluster.node_groups):
        name = f"compute:{g}"
        v = cal.compute_factor(g) if cal is not None else 1.0
        s = std[name] / v if name in std else WEAK_PRIOR_SIGMA["compute"]
        out[name] = (math.exp(-Z80 * s), math.exp(Z80 * s))
    for name in ("net_intra", "net_inter"):
        v = float(getattr(cal, name)) if cal is not None else 1.0
        s = std[name] / v if name in std else WEAK_PRIOR_SIGMA[name]
        out[name] = (math.exp(-Z80 * s), math.exp(Z80 * s))
    s = std.get("per_microbatch_s", WEAK_PRIOR_SIGMA["per_microbatch_s"])
    base = cal.per_microbatch_s if cal is not None else 0.0
    out["per_microbatch_s"] = (-min(Z80 * s, base), Z80 * s)
    return out


def _perturbed(job: Job, knob: str, x: float) -> Job:
    """The job with one knob moved by `x` relative to where it is (no range check: a relative
    move of an already calibrated job)."""
    if knob.startswith("compute:"):
        scale = Calibration.model_construct(compute={knob.split(":", 1)[1]: x})
        return job.model_copy(update={"cluster": scale.scale_cluster(job.cluster)})
    if knob in ("net_intra", "net_inter"):
        scale = (Calibration.model_construct(net_intra=x) if knob == "net_intra"
                 else Calibration.model_construct(net_inter=x))
        return job.model_copy(update={"cluster": scale.scale_cluster(job.cluster)})
    cal = job.calibration or Calibration()
    return job.model_copy(update={"calibration": cal.model_copy(
        update={"per_microbatch_s": cal.per_microbatch_s + x})})


_LABEL = {"net_intra": "NVLink", "net_inter": "the inter-node network",
          "per_microbatch_s": "the fixed time per micro-batch"}


def _what(knob: str) -> str:
    return f"{knob.split(':', 1)[1]} compute" if knob.startswith("compute:") else _LABEL[knob]


def _how(knob: str, x: float) -> str:
    if knob == "per_microbatch_s":
        return f"{abs(x) * 1e3:.0f} ms {'longer' if x > 0 else 'shorter'}"
    return f"{abs(x - 1):.0%} {'faster' if x > 1 else 'slower'}"


def _phrase(knob: str, x: float) -> str:
    return f"{_what(knob)} is {_how(knob, x)}"


def sensitivity(job: Job, plans: Sequence[Plan], ranges: dict[str, tuple[float, float]]
                | None = None, labels: Sequence[str] | None = None) -> list[str]:
    """Re-rank `plans` (best first, at most a few) with each knob at each end of its range;
    one line per knob saying whether #1 stays best (`labels` name the plans; default #i)."""
    if len(plans) < 2:
        return []
    names = list(labels) if labels is not None else [f"#{i + 1}" for i in range(len(plans))]
    lines: list[str] = []
    for knob, ends in (ranges or knob_ranges(job)).items():
        stays, loses = [], []
        for x in ends:
            if knob == "per_microbatch_s" and x == 0.0:
                continue
            j = _perturbed(job, knob, x)
            steps = [step_time(j, p).step_s for p in plans]
            win = min(range(len(plans)), key=lambda i: (steps[i], i))
            if win == 0:
                stays.append(_how(knob, x))
            else:
                loses.append(f"loses to {names[win]} if {_phrase(knob, x)}")
        parts = ([f"stays best if {_what(knob)} is {' or '.join(stays)}"] if stays else []) \
            + loses
        if parts:
            lines.append("; ".join(parts))
    return lines


def pessimistic_job(job: Job) -> Job:
    """The job with every calibration knob at the slow end of its 80 % range at once (compute
    and both networks slower, the fixed time per micro-batch longer: `knob_ranges`): the
    `--objective robust` job. A plan's step time under it is the pessimistic end of its
    interval as a function of its breakdown: a gain carried by a term whose knob is least
    evidenced (widest range: the weak priors of calibrate/prior.py, or the calibration's fitted
    sd)
    shrinks most. Memory is unchanged (no knob moves it), and each time term is a
    non-increasing function of every rate, so a plan is never faster under it."""
    j = job
    for knob, (lo, hi) in knob_ranges(job).items():
        slow = hi if knob == "per_microbatch_s" else lo
        if slow != (0.0 if knob == "per_microbatch_s" else 1.0):
            j = _perturbed(j, knob, slow)
    return j
