"""Nominal 80 % prediction intervals of step time, tokens/s/GPU and peak memory.

Uncalibrated, the intervals are the 10th / 90th percentiles of the model's leave-one-source-out
error, e = ln(measured / predicted), over the published runs of `benchmarks/` (produced by
`python benchmarks/intervals.py`, see there for the method and the nested coverage it scores):
per recipe family for tokens/s/GPU (the step time interval is its reciprocal), one table for
memory. With a calibration (spec/calibration.py) carrying its own fitted intervals, those
replace the tables: they come from the calibration residuals (autoparallel_cp/calibrate).

The memory interval also gives a plan's chance of running out of memory (`oom_risk`), which
marks the near-capacity plans that `solve` returns instead of dropping (search/capacity.py).

The package never reads `benchmarks/` at run time: the numbers below are a copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from autoparallel_cp.spec import GPUSpec, Job

#: ln(measured / predicted) tokens/s/GPU, (10th, 90th) percentile of the leave-one-source-out
#: errors, each source weighing the same, per recipe family ("megatron"; "pytorch" = FSDP,
#: torchtitan, AMP) and per regime where the family's errors differ (Megatron dense / MoE).
#: Produced by `python benchmarks/intervals.py` on 2026-12-06 (296 runs from 19 sources;
#: rerun in session 27 after group-limited routing moved four DeepSeek-V3 rows); nested
#: leave-one-source-out coverage 82.1 %, median relative width 22.3 % (benchmarks/
#: RESULTS.md, "Calibration and intervals"). Every Megatron MoE source is over-predicted, so
#: that table's interval lies below the prediction (q90 < 0).
THROUGHPUT_LOG_ERROR: dict[str, tuple[float, float]] = {
    "megatron": (-0.2245, 0.0591),
    "megatron-dense": (-0.1451, 0.0805),
    "megatron-moe": (-0.3826, -0.0662),
    "pytorch": (-0.1650, 0.2415),
}

#: ln(measured / predicted) memory, (10th, 90th) percentile over the 36 measured memory rows
#: (18 H200 pytorch-amp max allocated vs the allocated peak; 18 torchtitan max reserved vs the
#: peak + the fragmentation of its transient part), each source weighing the same. Same script
#: and date.
MEMORY_LOG_ERROR: tuple[float, float] = (-0.0428, 0.1565)


def default_mem_headroom() -> float:
    """Default `--mem-headroom`: the fraction h with need·exp(q90) <= capacity ⟺ need <=
    (1 - h)·capacity, q90 the 90th-percentile memory under-prediction (a plan at the upper end
    of its memory interval still fits)."""
    return round(max(0.0, -math.expm1(-MEMORY_LOG_ERROR[1])), 3)


def family(job: Job) -> str:
    """Recipe family of the interval tables: 'megatron' or 'pytorch' (FSDP, torchtitan, AMP)."""
    return "megatron" if job.recipe.framework == "megatron" else "pytorch"


def regime(job: Job) -> str:
    """The THROUGHPUT_LOG_ERROR key of a job: its family's MoE or dense table where the family
    has one, else the family's pooled table."""
    fam = family(job)
    key = fam + ("-moe" if job.model.moe is not None else "-dense")
    return key if key in THROUGHPUT_LOG_ERROR else fam


def peak_scale(job: Job, gpu: GPUSpec) -> float:
    """Factor by which the job's calibration scaled `gpu`'s peaks (1 uncalibrated): MFU divides
    by the data-sheet peak."""
    return job.calibration.compute_factor(gpu.name) if job.calibration is not None else 1.0


def time_log_interval(job: Job) -> tuple[float, float]:
    """(q10, q90) of ln(measured / predicted) tokens/s/GPU for this job."""
    cal = job.calibration
    if cal is not None and cal.time_interval is not None:
        return cal.time_interval.lo, cal.time_interval.hi
    return THROUGHPUT_LOG_ERROR[regime(job)]


def memory_log_interval(job: Job) -> tuple[float, float]:
    """(q10, q90) of ln(measured / predicted) peak memory for this job."""
    cal = job.calibration
    if cal is not None and cal.memory_interval is not None:
        return cal.memory_interval.lo, cal.memory_interval.hi
    return MEMORY_LOG_ERROR


#: z of the 90th percentile of a standard normal (the intervals' ends are the 10th / 90th)
Z90 = NormalDist().inv_cdf(0.9)


def oom_risk(job: Job, required_bytes: float, capacity_bytes: float) -> float:
    """The chance that a plan needing `required_bytes` (predicted peak + overheads) does not fit
    in `capacity_bytes` (the GPU's memory, before any `--mem-headroom`).

    The memory error e = ln(measured / predicted) is taken as normal through the two ends of
    its nominal 80 % interval (`memory_log_interval`: mean (q10 + q90) / 2, sd (q90 - q10) /
    (2 z90)), so risk = P(e > ln(capacity / required)). One e scales every stage of a plan
    (the same model error), so the most loaded stage's risk is the plan's. At the default
    headroom's edge (`default_mem_headroom`: required = capacity exp(-q90)) the risk is 10 %.
    """
    if required_bytes <= 0:
        return 0.0
    if capacity_bytes <= 0:
        return 1.0
    lo, hi = memory_log_interval(job)
    sd = (hi - lo) / (2.0 * Z90)
    margin = math.log(capacity_bytes / required_bytes)
    if sd <= 0:
        return 1.0 if margin < (lo + hi) / 2.0 else 0.0
    return 1.0 - NormalDist((lo + hi) / 2.0, sd).cdf(margin)


def near_capacity(required_bytes: float, capacity_bytes: float, headroom: float) -> bool:
    """Whether a plan's need is above the capacity less the `--mem-headroom` fraction: it may
    fit, and is returned, but is called risky (its `oom_risk` says how risky)."""
    return required_bytes > capacity_bytes * (1.0 - headroom) * (1.0 + 1e-12)


@dataclass(frozen=True)
class PlanIntervals:
    """[lo, hi] nominal 80 % intervals of one plan's predictions."""

    step_s: tuple[float, float]
    tokens_per_s_per_gpu: tuple[float, float]
    peak_bytes: tuple[float, float]


def plan_intervals(job: Job, step_s: float, tokens_per_s_per_gpu: float,
                   peak_bytes: float) -> PlanIntervals:
    """Intervals around the point predictions (the log errors of the module docstring)."""
    lo, hi = time_log_interval(job)
    mlo, mhi = memory_log_interval(job)
    return PlanIntervals(
        step_s=(step_s * math.exp(-hi), step_s * math.exp(-lo)),
        tokens_per_s_per_gpu=(tokens_per_s_per_gpu * math.exp(lo),
                              tokens_per_s_per_gpu * math.exp(hi)),
        peak_bytes=(peak_bytes * math.exp(mlo), peak_bytes * math.exp(mhi)),
    )

