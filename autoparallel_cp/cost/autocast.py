"""Autocast over fp32 weights (the pytorch-amp recipe, `transient_weight_copy_bytes` > 0): the
weight casts a forward makes and the gradient work each micro-batch's backward adds.

Sources: aten/src/ATen/autocast_mode.cpp `cached_cast` (a leaf fp32 weight is cast to bf16 once
per outermost autocast region, then cached); the cast node's backward returns the gradient in
the input's dtype; torch/csrc/autograd/functions/accumulate_grad.h adds each new gradient into
an existing `.grad` in place (`variable_grad += new_grad`). Kernel rates measured on the H200
in session 15 (benchmarks/data/h200_s15/probe_set1.jsonl, kind=op): the fp32->bf16 cast
4,100 GB/s and the fp32 add 4,255 GB/s, i.e. the streaming rate (`efficiency.HBM_EFFICIENCY`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoparallel_cp.cost.common import FloatArray, node
from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.flops import Gemm
from autoparallel_cp.spec import GPUSpec, Job


def autocast_cast_s(job: Job, gpu: GPUSpec, gemms: Sequence[Gemm]) -> FloatArray:
    """Seconds of autocast's weight casts in one forward of a layer with `gemms` (0 unless the
    recipe runs autocast over fp32 weights, `transient_weight_copy_bytes` > 0).

    Autocast casts every weight a forward uses (read fp32, write the bf16 copy:
    aten/src/ATen/autocast_mode.cpp `cached_cast`, cached for the leaf weights until the
    outermost autocast region exits, i.e. once per micro-batch's forward; a checkpointed
    layer's replay in backward casts again, so it is part of the forward the replay repeats).
    The backward's cast back is `autocast_grad_s` (charged by sync.microbatch_grad_factors)."""
    rec = job.recipe
    w = sum((gm.count * gm.k * gm.n for gm in gemms), np.zeros(()))
    if rec.transient_weight_copy_bytes <= 0:
        return 0.0 * w
    return hbm_time(gpu, w * (rec.weight_bytes + rec.transient_weight_copy_bytes))


@dataclass(frozen=True)
class GradBack:
    """Seconds per parameter per micro-batch of autocast's gradient work."""

    cast_back: float  # the bf16 weight gradient cast to the parameter dtype (any ZeRO stage)
    accumulate: float  # AccumulateGrad's in-place add into the fp32 `.grad` (zero <= 1)


def autocast_grad_s(job: Job, g: int, autograd_accum: bool) -> GradBack:
    """Per parameter per micro-batch: the cast back (r copy bytes, w weight_bytes: 6 B) and the
    fp32 accumulation (r 2·grad_bytes, w grad_bytes: 12 B) on node group `g`; both 0 without
    autocast over fp32 weights. The add is charged on every micro-batch (exact after
    `zero_grad(set_to_none=False)`, an upper bound by one pass per step after
    set_to_none=True), and not again when the recipe's `autograd_grad_accum` already does."""
    rec = job.recipe
    if rec.transient_weight_copy_bytes <= 0:
        return GradBack(0.0, 0.0)
    gpu = node(job, g).gpu
    back = float(hbm_time(gpu, rec.transient_weight_copy_bytes + rec.weight_bytes))
    add = 0.0 if autograd_accum else float(hbm_time(gpu, 3.0 * rec.grad_bytes))
    return GradBack(back, add)
