"""Straggler term: synchronous training runs every step at the pace of its slowest GPU.

Mechanism. GPUs of one SKU in one cluster sustain different clocks on the same kernel
(manufacturing variability under the board's power management: a leakier chip reaches the
power limit at a lower SM clock). Sinha et al., "Not All GPUs Are Created Equal:
Characterizing Variability in Large-Scale, Accelerator-Rich Systems" (SC'22, arXiv 2208.11035
v3) ran the same single-GPU kernels (cuBLAS SGEMM 25536^3, ResNet-50, BERT, LAMMPS, PageRank)
on over 90% of the GPUs of Summit, Vortex, Longhorn, Frontera (V100) and Corona (MI60) and
report "8% (max 22%) average performance variation" across GPUs of one SKU, "with outliers up
to 1.5X slower than the median GPU". The per-GPU figure is the mean kernel duration of a run
(artifact hal-uw/gpu_variability_sc22_artifact, aggregate_scripts/gpu-aggregator.py @fbd2605:
`perf` = mean duration of the kernel instances of one GPU), i.e. a persistent property of the
GPU, not a per-kernel jitter that averages out within a step.

How "variation" is defined. The artifact's plotting script (plot_script/plot_aggregated.py
@bc84e72) normalises every GPU to the median and takes the span of the box plot's whiskers:
variation = ((Q3 + 1.5·IQR) - (Q1 - 1.5·IQR)) / Q2 = 4·IQR / median. Outliers beyond the
whiskers (the 1.5x GPUs) are excluded; production training finds and removes such hosts
(Llama 3, arXiv 2407.21783, "Reliability and operational challenges"; MegaScale, arXiv
2402.15627, its straggler and MFU-drop diagnosis), so the body of the distribution is what a
healthy job draws from.

Distribution derived (not fitted to any training row). Per-GPU time of a compute-bound kernel
t_i = t_med·(1 + σ·Z_i), Z_i ~ N(0, 1). For a normal, IQR = 2·Φ⁻¹(0.75)·σ = 2·0.67449·σ =
1.34898·σ, so variation = 4 · 1.34898·σ = 5.3959·σ and

    σ = 0.08 / 5.3959 = 0.014826   (1.48% per-GPU relative sigma; the 22% max gives 4.08%).

A step joins every GPU of the job: tensor-parallel groups wait at every collective, pipeline
stages at every send/receive, and the data-parallel gradient reduction (or ZeRO's gathers)
joins all replicas once per step; a GPU that is persistently slow therefore sets the pace of
the step's compute. The expected stretch of the compute-bound time is

    E[max_i t_i] / t_med = 1 + σ·E[max of N standard normals],   N = the job's GPU count.

E[max of N] = ∫ x·N·φ(x)·Φ(x)^(N-1) dx (Simpson quadrature, cached per N): 0 at N = 1,
1/√π = 0.5642 at N = 2, 1.4236 at 8, 3.2482 at 1,024, 3.9714 at 16,384: +0.84%, +2.1%, +4.8%
and +5.9% of the compute-bound time at σ = 1.48%.

What it stretches. SGEMM is the kernel whose speed follows the SM clock; the clock sets tensor-
core throughput, so the GEMMs and the (tensor-core, compute-bound) attention kernels are
stretched. HBM-bound elementwise time is not: the HBM clock of data-center parts is fixed (not
boosted with the SM clock under the power limit), and network time is set by the NICs and
links. Those terms are left as they are.

Solver bounds. The stretch depends only on the job's GPU count, which every plan of a job uses
in full (dp = N / (tp·pp·cp)): it is one constant c ≥ 1 per job. It multiplies the GEMM and
attention times inside the factor functions (`layer_factors`, `embedding_head`, `mtp`, op-level
SAC replay) that both the exact `evaluate` and the solver's integer tables are built from, so a
table entry and the exact cost it bounds are scaled by the same c; every bound of the form
"table sum <= exact cost" stays valid (both sides are the same functions of the stretched
terms), and monotonic bounds stay monotonic since c > 0 is plan-independent. A single-GPU job
(N = 1) gets c = 1 exactly.

Known limits, reported rather than modelled: the figure comes from V100 (and MI60) clusters,
not A100/H100; its 8% is averaged over applications that include memory-bound ones
(PageRank), and Llama 3 (same section) reports a further diurnal 1-2% throughput swing from
temperature-driven DVFS that is common to all GPUs and so is not a straggler term. Clusters of
several GPU types use the job's GPU count for every group (an upper bound of each group's N).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np

from autoparallel_cp.spec import Job

#: Sinha et al. (arXiv 2208.11035 v3, abstract): average across clusters and applications of
#: the whisker span / median of per-GPU performance (see module docstring).
SINHA_AVERAGE_VARIATION = 0.08
#: Whisker span of a normal in sigmas: 4·IQR = 4·2·Φ⁻¹(0.75).
WHISKER_SPAN_SIGMAS = 8.0 * NormalDist().inv_cdf(0.75)
#: Per-GPU relative sigma of the sustained speed of compute-bound kernels.
GPU_SPEED_SIGMA = SINHA_AVERAGE_VARIATION / WHISKER_SPAN_SIGMAS

#: Simpson grid for E[max], each half-line on its own (the integrand jumps by 1 at x = 0):
#: Φ(x)^n is 1 (x > 12) / 0 (x < -12) to double precision for every n up to 10^7; step 1/512
#: keeps the quadrature error below 1e-9.
_XU = np.linspace(0.0, 12.0, 12 * 512 + 1)
_LOG_PHI_U = np.log1p(-np.array([0.5 * math.erfc(x / math.sqrt(2.0)) for x in _XU]))
_LOG_PHI_L = np.log([0.5 * math.erfc(x / math.sqrt(2.0)) for x in _XU])  # log Φ(-x)
_SIMPSON = np.ones_like(_XU)
_SIMPSON[1:-1:2], _SIMPSON[2:-1:2] = 4.0, 2.0
_SIMPSON *= float(_XU[1] - _XU[0]) / 3.0


@functools.cache
def expected_max_std_normal(n: int) -> float:
    """E[max of n i.i.d. standard normals] = ∫_0^∞ (1 - Φ(x)^n) dx - ∫_0^∞ Φ(-x)^n dx
    (composite Simpson on `_XU`; Φ^n as exp(n·log Φ), stable for large n)."""
    if n < 1:
        raise ValueError(f"need at least one GPU, got {n}")
    if n == 1:
        return 0.0
    upper = -np.expm1(n * _LOG_PHI_U)
    lower = np.exp(n * _LOG_PHI_L)
    return float(np.dot(_SIMPSON, upper - lower))


def compute_stretch(num_gpus: int, sigma: float = GPU_SPEED_SIGMA) -> float:
    """Expected step stretch of compute-bound kernel time when `num_gpus` GPUs synchronise
    every step: 1 + σ·E[max of N standard normals] (module docstring)."""
    return 1.0 + sigma * expected_max_std_normal(int(num_gpus))


def job_compute_stretch(job: Job) -> float:
    """The stretch of `job`: every plan uses all of the job's GPUs, so one constant per job."""
    return compute_stretch(job.num_gpus)
