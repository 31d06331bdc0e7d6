"""First and last pipeline stage extras: embedding, final norm, LM head and loss."""

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
    _is_pytorch,
    node,
    options_for,
)
from autoparallel_cp.cost.constants import (
    CE_BYTES_PER_LOGIT,
    CE_FWD_BYTES_PER_LOGIT,
    COMPILED_CE_BYTES_PER_LOGIT,
    COMPILED_CE_FWD_BYTES_PER_LOGIT,
    COMPILED_LOGITS_BYTES,
    LOGITS_BYTES,
    LOSS_PARALLEL_LOGITS_BYTES,
)
from autoparallel_cp.cost.efficiency import (
    EAGER_CE_HBM_FRACTION,
    GEMM_UNALIGNED_BWD_FRACTION,
    GEMM_UNALIGNED_FWD_FRACTION,
    gemm_time,
    hbm_time,
    hbm_time_at,
    unaligned_gemm_time,
)
from autoparallel_cp.cost.flops import head_gemm
from autoparallel_cp.cost.straggler import job_compute_stretch
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.params import count_params

# ---------------------------------------------------------------------------------------------
# First / last stage
# ---------------------------------------------------------------------------------------------


def unaligned_vocab(job: Job) -> bool:
    """Whether the LM head's GEMMs run with an unaligned leading dimension: a PyTorch recipe
    keeps the tokenizer's vocabulary (HF transformers / torchtitan build `nn.Linear(h, V)`
    as given), and a V that is not a multiple of 8 makes every head GEMM's [.., V] operand
    misaligned (efficiency.GEMM_UNALIGNED_*). Megatron pads the vocabulary to a multiple of
    `make_vocab_size_divisible_by` (128) x tp (megatron/training/tokenizer/tokenizer.py
    `_vocab_size_with_padding`), so its head is always aligned."""
    return _is_pytorch(job.recipe) and job.model.vocab_size % 8 != 0


@dataclass(frozen=True)
class EdgeFactors:
    """Embedding (first stage) and LM head + loss (last stage) per micro-batch."""

    emb_params: FloatArray  # per GPU
    emb_act_bytes: FloatArray  # per in-flight micro-batch (input ids, dropout mask)
    emb_time_s: FloatArray
    head_params: FloatArray  # final norm + LM head per GPU
    head_act_bytes: FloatArray  # final-norm input + head input, one micro-batch
    head_work_bytes: FloatArray  # logits at the loss peak (transient)
    head_time_s: FloatArray
    head_compute_s: FloatArray
    #: of head_time_s: the forward (head GEMM, weight cast, the loss's forward passes, the
    #: vocab-parallel all-reduces) and the head's weight-gradient GEMM (cost/pass_split.py)
    head_fwd_s: FloatArray | float = 0.0
    head_wgrad_s: FloatArray | float = 0.0


def edge_factors(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, sp: ArrayLike,
                 mbs: ArrayLike, options: CostOptions | None = None) -> EdgeFactors:
    """First/last-stage extras (Korthikanti §4.3): embedding output and ids, final norm, LM head,
    logits in fp32 for the loss (`LOGITS_BYTES`), vocab-parallel over tp.

    Time: head GEMM fwd + dgrad + wgrad at shape efficiency; cross entropy and embedding
    gather/scatter as HBM traffic; the tied/untied embedding all-reduce is ignored.
    """
    opts = options_for(job, options)
    model = job.model
    recipe = job.recipe
    nd = node(job, g)
    gpu = nd.gpu
    tp_, cp_, sp_, mbs_ = np.broadcast_arrays(_f(tp), _f(cp), _f(sp), _f(mbs))
    s = float(job.seq_len)
    tokens = mbs_ * s / cp_
    h = model.hidden_size
    v = model.vocab_size
    pc = count_params(model)
    ab = float(recipe.activation_bytes)
    res = 4.0 if _fp32_residual(recipe) else ab
    rep = np.where(sp_ > 0, 1.0 / tp_, 1.0)
    emb_params = (pc.embedding + pc.position_embedding) / tp_ + pc.embedding_norm
    head_params = pc.lm_head / tp_ + pc.final_norm
    emb_act = tokens * (8.0 + (h * rep if opts.dropout else 0.0))  # int64 ids (+ dropout mask)
    emb_time = hbm_time(gpu, tokens * h * (res + ab) * 3.0)
    head_act = tokens * (res + ab) * h * rep + tokens * 8.0  # final norm in, head in, labels
    # a compiled loss (behaviour `compiled_loss`) fuses the upcast and the softmax chain; the
    # vocab-parallel DTensor loss (tp > 1) keeps its own figure
    compiled = _is_pytorch(recipe) and recipe.behaviour.compiled_loss
    if _is_pytorch(recipe):
        lb = np.where(tp_ > 1, LOSS_PARALLEL_LOGITS_BYTES,
                      COMPILED_LOGITS_BYTES if compiled else LOGITS_BYTES["pytorch"])
    else:
        lb = LOGITS_BYTES["megatron"] + 0.0 * tp_
    head_work = tokens * v / tp_ * lb
    hg = head_gemm(model, tokens, tp_)
    # the LM head stays in bf16 under fp8 training: Megatron-Core's output layer is
    # tensor_parallel.ColumnParallelLinear, not a TE module (models/gpt/gpt_model.py @d98e8a64
    # l. 271-277, TE only with the MXFP8 output-projection option), and torchtitan's float8
    # converter skips `output` (filter_fqns = ["output"] in its llama3 train configs @ce5ace24d;
    # `fqn != "output"` before, torchtitan/float8.py @aff949468)
    dtype = "bf16"
    if unaligned_vocab(job):
        g_f = unaligned_gemm_time(gpu, hg.m, hg.k, hg.n, GEMM_UNALIGNED_FWD_FRACTION)
        g_d = unaligned_gemm_time(gpu, hg.m, hg.n, hg.k, GEMM_UNALIGNED_BWD_FRACTION)
        g_w = unaligned_gemm_time(gpu, hg.k, hg.m, hg.n, GEMM_UNALIGNED_BWD_FRACTION)
    else:
        g_f = gemm_time(gpu, hg.m, hg.k, hg.n, dtype)
        g_d = gemm_time(gpu, hg.m, hg.n, hg.k, dtype)
        g_w = gemm_time(gpu, hg.k, hg.m, hg.n, dtype)
    stretch = job_compute_stretch(job)
    head_compute = stretch * (g_f + g_d + g_w)
    head_fwd = stretch * g_f
    if recipe.transient_weight_copy_bytes > 0:  # autocast's cast of the head weight (fwd)
        cast = hbm_time(
            gpu, pc.lm_head / tp_ * (recipe.weight_bytes + recipe.transient_weight_copy_bytes))
        head_compute, head_fwd = head_compute + cast, head_fwd + cast
    # fp32 logits: cast, max/exp/sum, softmax, grad, cast back (CE_BYTES_PER_LOGIT); PyTorch's
    # eager chain at its measured rate (efficiency.EAGER_CE_HBM_FRACTION)
    eager_per_logit = CE_BYTES_PER_LOGIT["pytorch" if _is_pytorch(recipe) else "megatron"]
    ce_bytes = tokens * v / tp_ * eager_per_logit
    if _is_pytorch(recipe):
        eager_ce = hbm_time_at(gpu, ce_bytes, EAGER_CE_HBM_FRACTION)
        fused_ce = hbm_time(gpu, tokens * v / tp_ * COMPILED_CE_BYTES_PER_LOGIT)
        eager = (tp_ > 1) | (not compiled)
        ce_time = np.where(eager, eager_ce, fused_ce)
        # the forward passes' share of the loss's bytes (constants.CE_FWD_BYTES_PER_LOGIT)
        ce_fwd = np.where(eager, CE_FWD_BYTES_PER_LOGIT["pytorch"] / eager_per_logit,
                          COMPILED_CE_FWD_BYTES_PER_LOGIT / COMPILED_CE_BYTES_PER_LOGIT)
    else:
        ce_time = hbm_time(gpu, ce_bytes)
        ce_fwd = CE_FWD_BYTES_PER_LOGIT["megatron"] / eager_per_logit + 0.0 * tp_
    head_compute = head_compute + ce_time
    # vocab-parallel CE all-reduces 3 scalars per token over tp (max, sum-exp, target logit)
    ce_comm = comm.all_reduce(nd, tp_, 1, tokens * 4.0 * 3)
    head_time = head_compute + ce_comm
    head_fwd = head_fwd + ce_fwd * ce_time + ce_comm
    return EdgeFactors(
        emb_params=emb_params + 0.0 * tokens, emb_act_bytes=emb_act, emb_time_s=emb_time,
        head_params=head_params + 0.0 * tokens, head_act_bytes=head_act,
        head_work_bytes=head_work, head_time_s=head_time, head_compute_s=head_compute,
        head_fwd_s=head_fwd, head_wgrad_s=stretch * g_w,
    )
