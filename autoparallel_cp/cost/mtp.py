"""DeepSeek-V3 multi-token prediction (MTP): the work of one MTP depth outside its transformer
layer, on the last pipeline stage.

Per depth (DeepSeek-V3 report arXiv 2412.19437 §2.2; Megatron-Core
megatron/core/transformer/multi_token_prediction.py, `MultiTokenPredictionLayer` at d98e8a64):
the shifted tokens' embedding lookup (the shared embedding), RMSNorms of that embedding
(`enorm`) and of the incoming hidden state (`hnorm`), their concatenation, the projection
`eh_proj` (ColumnParallelLinear 2h -> h, its output gathered over tp and scattered back to the
sequence-parallel layout), one transformer layer (costed by `layer_factors` of the model's
last-layer kind, not here), the depth's final norm and the shared LM head with its own
cross-entropy loss (`embedding_head.edge_factors` head terms: the same GEMM and loss work).

The composition (memory.py / steptime.py) adds `mtp_layers` x (this + one layer) to the last
stage; `MtpFactors.copy_params` (the word-embedding copy Megatron builds on the MTP stage,
gpt_model.py `if self.pre_process or self.mtp_process`) only when pp > 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.common import (
    ArrayLike,
    CostOptions,
    FloatArray,
    _f,
    _fp32_residual,
    node,
    options_for,
)
from autoparallel_cp.cost.constants import ELEMENTWISE_BWD_FACTOR
from autoparallel_cp.cost.efficiency import gemm_time, hbm_time
from autoparallel_cp.cost.embedding_head import edge_factors
from autoparallel_cp.cost.straggler import job_compute_stretch
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.params import count_params, layer_breakdown


@dataclass(frozen=True)
class MtpFactors:
    """One MTP depth without its transformer layer, per micro-batch (all arrays broadcast)."""

    params: FloatArray  # eh_proj (over tp) + enorm, hnorm, final norm, per GPU
    copy_params: FloatArray  # word-embedding copy per GPU on the last stage (pp > 1 only)
    act_bytes: FloatArray  # kept for backward, one micro-batch (the last model chunk)
    time_s: FloatArray
    compute_s: FloatArray
    tp_s: FloatArray


def mtp_layer_kind(job: Job) -> bool:
    """Whether the MTP transformer layer is MoE: the kind of the layer after the last one
    (spec/params.py `_mtp_module`: a block of the kind of the last layer)."""
    return job.model.is_moe_layer(job.model.num_layers)


def mtp_factors(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, sp: ArrayLike,
                mbs: ArrayLike, options: CostOptions | None = None) -> MtpFactors:
    """Per-depth MTP extras on node group `g` (module docstring).

    Time: embedding lookup as the first stage's (`edge_factors.emb_time_s`); three norms read
    and write the residual and activation copies of h per token, the concatenation reads and
    writes 2h (backward ELEMENTWISE_BWD_FACTOR x); eh_proj's GEMM (tokens x 2h x h/tp) forward,
    dgrad and wgrad at shape efficiency; TP: with sequence parallelism the input all-gather
    (2h) and the output gather (h) forward, the input-gradient reduce-scatter (2h) and the
    scatter's all-gather (h) backward; without it the output gather forward and the
    input-gradient all-reduce (2h) backward (Megatron mappings.py); the head and its loss as
    the last stage's (`edge_factors.head_time_s`).
    Activations: the embedding output (enorm input) and eh_proj's input (2h, sequence-sharded
    with SP) plus the head's (`head_act_bytes`: final-norm input, head input, labels); the
    hnorm input is the main model's output, already kept by its final norm. The second loss
    keeps its logits (`head_work_bytes`: Megatron's vocab-parallel cross entropy saves the
    fp32 softmax for backward, counted at the head's loss-peak bytes per logit, 2 B above the
    4 B it saves) while the main loss's backward runs its own peak. Under full
    recompute Megatron checkpoints the layer with eh_proj and the final norm
    (`_checkpointed_forward`); their few small tensors are kept as without it here.
    """
    opts = options_for(job, options)
    model = job.model
    recipe = job.recipe
    nd = node(job, g)
    gpu = nd.gpu
    tp_, cp_, sp_, mbs_ = np.broadcast_arrays(_f(tp), _f(cp), _f(sp), _f(mbs))
    tokens = mbs_ * float(job.seq_len) / cp_
    h = float(model.hidden_size)
    ab = float(recipe.activation_bytes)
    res = 4.0 if _fp32_residual(recipe) else ab
    rep = np.where(sp_ > 0, 1.0 / tp_, 1.0)
    edge = edge_factors(job, g, tp_, cp_, sp_, mbs_, opts)
    pc = count_params(model)
    proj = 2.0 * h * h
    norms = pc.mtp / max(model.mtp_layers, 1) - layer_breakdown(model, model.num_layers).total \
        - proj if model.mtp_layers else 0.0
    params = proj / tp_ + norms
    copy = pc.embedding / tp_
    # norms (3) + concatenation, forward; backward ELEMENTWISE_BWD_FACTOR x
    ew = hbm_time(gpu, tokens * rep * (3 * (res + ab) * h + 2 * 2 * ab * h))
    dtype = recipe.compute_dtype
    m, k, n = tokens, 2.0 * h, h / tp_
    gemm = job_compute_stretch(job) * (gemm_time(gpu, m, k, n, dtype)
                                       + gemm_time(gpu, m, n, k, dtype)
                                       + gemm_time(gpu, k, m, n, dtype))
    compute = edge.emb_time_s + ew * (1.0 + ELEMENTWISE_BWD_FACTOR) + gemm + edge.head_compute_s
    msg = tokens * h * ab
    tp_sp = (comm.all_gather(nd, tp_, 1, 2 * msg) + comm.all_gather(nd, tp_, 1, msg)
             + comm.reduce_scatter(nd, tp_, 1, 2 * msg) + comm.all_gather(nd, tp_, 1, msg))
    tp_nosp = comm.all_gather(nd, tp_, 1, msg) + comm.all_reduce(nd, tp_, 1, 2 * msg)
    tp_s = np.where(tp_ > 1, np.where(sp_ > 0, tp_sp, tp_nosp), 0.0) \
        + (edge.head_time_s - edge.head_compute_s)
    act = tokens * rep * (res + 2 * ab) * h + edge.head_act_bytes + edge.head_work_bytes
    return MtpFactors(
        params=params + 0.0 * tokens, copy_params=copy + 0.0 * tokens, act_bytes=act,
        time_s=compute + tp_s, compute_s=compute, tp_s=tp_s,
    )


def mtp_recomputed(recompute: str, recompute_layers: int | None) -> bool:
    """Whether the plan's recompute replays the MTP layer: Megatron checkpoints it under
    `--recompute-granularity full` with `--recompute-method uniform` and skips it (with a
    warning) under `block` (multi_token_prediction.py `_checkpointed_forward`); emit/megatron.py
    writes uniform exactly when `recompute_layers` is None. Selective recompute applies inside
    the layer as in every other one."""
    return recompute == "full" and recompute_layers is None
