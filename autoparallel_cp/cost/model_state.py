"""Parameters and model states per GPU (weights, gradients, optimizer; ZeRO sharding), transient
weight copies and the constant allowances outside the breakdown."""

from __future__ import annotations

import numpy as np

from autoparallel_cp.cost.common import (
    ArrayLike,
    FloatArray,
    _f,
    _is_pytorch,
)
from autoparallel_cp.cost.constants import (
    ALLOCATOR_FRAGMENTATION,
    CUDA_CONTEXT_BYTES,
    DDP_BUCKET_BYTES,
    ZERO3_RESIDENT_LAYERS,
)
from autoparallel_cp.cost.pp_grad_sync import deferred_by_pp
from autoparallel_cp.spec import GIB, Job, TrainingRecipe
from autoparallel_cp.spec.params import layer_breakdown

# ---------------------------------------------------------------------------------------------
# Parameters and model states
# ---------------------------------------------------------------------------------------------


def layer_param_counts(job: Job, moe: bool, tp: ArrayLike, ep: ArrayLike,
                       etp: ArrayLike | None = None) -> tuple[FloatArray, FloatArray]:
    """(dense, expert) parameters of one layer held by one GPU.

    Megatron `theoretical_memory_usage.py`: matrices split over tp, norms replicated, routed
    experts split over ep and expert-tp (`etp`, Megatron's default tp when None): E/ep local
    experts, each 1/etp of its weights (parallel_state.py expert grid etp x ep x edp).
    """
    model = job.model
    idx = next((i for i in range(model.num_layers) if model.is_moe_layer(i) == moe), 0)
    lp = layer_breakdown(model, idx)
    tp_ = _f(tp)
    ep_ = _f(ep)
    etp_ = tp_ if etp is None else _f(etp)
    dense = (lp.dense - lp.norms) / tp_ + lp.norms
    expert = lp.expert / (etp_ * ep_)
    return dense + 0.0 * ep_ * etp_, expert + 0.0 * tp_


def state_bytes_per_param(recipe: TrainingRecipe, zero: ArrayLike, shard: ArrayLike,
                          pp: ArrayLike = 1) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(weights, grads, optimizer) bytes per parameter with ZeRO stage `zero` over `shard` GPUs.

    ZeRO §5 (Rajbhandari et al. 2019): stage 1 shards optimizer states (master weights + Adam
    moments), stage 2 also gradients, stage 3 also weights. With megatron-bf16 (2 + 4 + 12):
    18 unsharded, 6 + 12/d distributed optimizer (Megatron dist_optimizer.md); with the ZeRO
    paper's fp16 mixed precision (2 + 2 + 12): 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N. Stages 2
    and 3 shard the gradients only when they reduce them every micro-batch (recipe
    `zero2_reduce`, `zero3_reduce`); reduced once per step they stay whole, as at stage 1,
    and so do they at pp > 1 under a pipelining that defers the reduction to the last
    backward (`pp_defers_reduce`: FSDP2 accumulates unsharded gradients while
    `set_requires_gradient_sync(False)`, cost/pp_grad_sync.py).
    """
    z = _f(zero)
    d = np.maximum(_f(shard), 1.0)
    w = recipe.weight_bytes / np.where(z >= 3, d, 1.0)
    # a ZeRO-2/3 that reduces once per step (`zero2_reduce` / `zero3_reduce` "step") keeps
    # whole gradients until then: only one that reduces every micro-batch holds sharded ones
    beh = recipe.behaviour
    sharded = np.where(z >= 3, beh.zero3_reduce != "step",
                       np.where(z >= 2, beh.zero2_reduce != "step", False))
    sharded = np.logical_and(sharded, np.logical_not(deferred_by_pp(recipe, pp)))
    gr = recipe.grad_bytes / np.where(sharded, d, 1.0)
    opt = (recipe.master_weight_bytes + recipe.optimizer_state_bytes) / np.where(z >= 1, d, 1.0)
    return w, gr, opt


def buffer_bytes_per_param(job: Job, zero: ArrayLike) -> FloatArray:
    """Transient bytes per parameter of the stage held at the peak, outside ZeRO-3.

    PyTorch autocast caches a bf16 copy of every fp32 weight used in forward until the autocast
    region exits, and autograd keeps them for backward (`transient_weight_copy_bytes`).
    Under ZeRO-3 the gathered layers replace this (see `zero3_buffer_bytes`).
    """
    z = _f(zero)
    return np.where(z >= 3, 0.0, float(job.recipe.transient_weight_copy_bytes))


def zero3_buffer_bytes(job: Job, tp: ArrayLike, ep: ArrayLike, zero: ArrayLike,
                       etp: ArrayLike | None = None) -> FloatArray:
    """ZeRO-3 / FSDP gathered parameters: `ZERO3_RESIDENT_LAYERS` full layers in bf16 (+ the
    gradient of one layer before its reduce-scatter, fp32 for pytorch recipes)."""
    dense, expert = layer_param_counts(job, job.model.moe is not None, tp, ep, etp)
    z = _f(zero)
    per = dense + expert
    gathered = ZERO3_RESIDENT_LAYERS * per * 2.0 + per * job.recipe.grad_bytes
    return np.where(z >= 3, gathered, 0.0)


#: Constant allocated bytes outside params/activations (comm buckets) by framework.
OTHER_BYTES = {"megatron": 0.0, "pytorch": float(DDP_BUCKET_BYTES)}


def other_bytes(job: Job) -> float:
    """Allocated bytes not in the breakdown's other fields (PyTorch DDP buckets), plus the
    calibrated memory reserve (spec/calibration.py `memory_reserve_gib`)."""
    reserve = job.calibration.memory_reserve_gib * GIB if job.calibration is not None else 0.0
    return OTHER_BYTES["pytorch" if _is_pytorch(job.recipe) else "megatron"] + reserve


def persistent_grads(recipe: TrainingRecipe) -> bool:
    """Whether the recipe's gradients live in buffers allocated once and never freed.

    Megatron recipes: yes. Megatron-Core DDP keeps them in `_ParamAndGradBuffer`
    (megatron/core/distributed/param_and_grad_buffer.py), NeMo's Apex DistributedFusedAdam in
    its contiguous grad buffer (NeMo-Framework-Launcher conf/training/gpt3/20b.yaml
    `contiguous_grad_buffer: True`), DeepSpeed's BF16_Optimizer in flat fp32 gradient buffers
    made at construction. PyTorch recipes: no, conservatively: `Optimizer.zero_grad` frees the
    `.grad` tensors by default (`set_to_none=True`, PyTorch docs since 2.0) and FSDP2 allocates
    each reduce-scattered gradient shard anew every step.
    """
    return not _is_pytorch(recipe)


def persistent_bytes(recipe: TrainingRecipe, params: float, grads: float,
                     optimizer: float) -> float:
    """Bytes of a GPU's allocated peak held in buffers allocated once at start-up and never
    freed: weights (or their ZeRO-3 / FSDP shards), master weights and optimizer states, and
    the gradients where `persistent_grads`. Everything else (activations, logits and loss
    buffers, ZeRO-3 gathered layers, autocast weight copies, communication buckets, the
    calibrated reserve) counts as transient, conservatively."""
    return params + optimizer + (grads if persistent_grads(recipe) else 0.0)


def transient_charge() -> float:
    """Bytes a GPU must hold per byte of transient allocation: the byte itself plus the
    fragmentation it brings into the cached segments (1 + ALLOCATOR_FRAGMENTATION)."""
    return 1.0 + ALLOCATOR_FRAGMENTATION


def grad_charge(recipe: TrainingRecipe) -> float:
    """Charge per gradient byte: 1 for persistent gradient buffers, `transient_charge()` else."""
    return 1.0 if persistent_grads(recipe) else transient_charge()


def fragmentation_bytes(peak: ArrayLike, persistent: ArrayLike) -> FloatArray:
    """Free bytes the caching allocator holds in its cached segments at the peak:
    ALLOCATOR_FRAGMENTATION x the transient part of the allocated peak (constants.py)."""
    return ALLOCATOR_FRAGMENTATION * (_f(peak) - _f(persistent))


def overhead_bytes(peak: ArrayLike, persistent: ArrayLike) -> FloatArray:
    """Memory the GPU needs beyond the allocated peak: CUDA context + allocator fragmentation
    on the transient allocations (`fragmentation_bytes`)."""
    return CUDA_CONTEXT_BYTES + fragmentation_bytes(peak, persistent)


def charged_bytes(peak: ArrayLike, persistent: ArrayLike) -> FloatArray:
    """What the allocated peak costs inside the caching allocator: persistent bytes once,
    transient bytes x `transient_charge()`; equals peak + fragmentation_bytes, i.e. the
    required bytes less the CUDA context. The solver's tables charge every term this way and
    compare it with the capacity less CUDA_CONTEXT_BYTES."""
    p = _f(persistent)
    return p + transient_charge() * (_f(peak) - p)
