"""Per-layer, per-micro-batch factors: saved bytes and time of forward, backward and recompute,
with the TP / CP / EP collectives each layer runs and how much of them compute hides.

Kept whole: `layer_factors` is one pass over a layer's compute, collectives and host-bound
terms that share its intermediate GPU times; split up it would pass a dozen arrays around."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from autoparallel_cp.cost import autocast, comm, fp8_casts, moe_host, unfused_ops
from autoparallel_cp.cost.activations import (
    _op_sac_per_token,
    _op_sac_recompute_s,
    layer_activation_per_token,
)
from autoparallel_cp.cost.async_tp import async_tp_layer, op_sac_replayed_inputs
from autoparallel_cp.cost.common import (
    ArrayLike,
    CostOptions,
    FloatArray,
    _f,
    _fused,
    _is_pytorch,
    _mode,
    node,
    options_for,
    routed_load,
)
from autoparallel_cp.cost.constants import (
    EAGER_ATTN_BWD_MASK_BYTES,
    EAGER_ATTN_BWD_PASSES,
    EAGER_ATTN_FWD_PASSES,
    EAGER_HOST_S_PER_LAYER,
    EAGER_HOST_S_RECOMPUTE,
    ELEMENTWISE_BWD_FACTOR,
)
from autoparallel_cp.cost.cp_ring import (
    ring_exchange,
    te_ring_merge_bytes,
    torch_ring_merge_bytes,
)
from autoparallel_cp.cost.efficiency import (
    flash_attention_time,
    gemm_time,
    hbm_time,
    sm_reserve_stretch,
)
from autoparallel_cp.cost.flops import (
    attention_core_flops,
    attention_dims,
    layer_gemms,
    window_kernel_length,
)
from autoparallel_cp.cost.layer_ops import (
    dtensor_sp_copy_bytes,
    elementwise_bytes_fwd,
    selective_replay_s,
    sp_gather_bytes,
)
from autoparallel_cp.cost.moe_comm import (
    allgather_permute_bytes,
    dispatch_time,
    ep_overlapped,
    folded_moe_comm,
    sort_chunks_bytes,
)
from autoparallel_cp.cost.moe_glu_bias import glu_clamp_bias_bytes
from autoparallel_cp.cost.straggler import job_compute_stretch
from autoparallel_cp.spec import GPUSpec, Job

# ---- per-layer factors ----

#: The forward GEMMs whose output Transformer Engine's userbuffers reduce-scatter (TE
#: `initialize_ub`: "proj_fprop", "fc2_fprop"), in `FrameworkBehaviour.ub_rs_sm_margin` order.
_UB_RS_GEMMS = ("out_proj", "mlp_fc2")


def _ub_rs_stretch(gpu: GPUSpec, opts: CostOptions, name: str,
                   tp: FloatArray) -> FloatArray | float:
    """Time factor of forward GEMM `name` for the SMs userbuffers reserve beside it (tp > 1)."""
    if name not in _UB_RS_GEMMS:
        return 1.0
    stretch = sm_reserve_stretch(gpu, opts.ub_rs_sm_margin[_UB_RS_GEMMS.index(name)])
    return np.where(tp > 1, stretch, 1.0)


@dataclass(frozen=True)
class LayerFactors:
    """Per layer, per micro-batch numbers (see module docstring). All arrays broadcast."""

    act_bytes: FloatArray
    ckpt_bytes: FloatArray
    work_bytes: FloatArray
    time_s: FloatArray
    recompute_s: FloatArray
    compute_s: FloatArray
    tp_s: FloatArray
    cp_s: FloatArray
    ep_s: FloatArray
    rc_compute_s: FloatArray  # recompute_s split: replayed forward compute
    rc_tp_s: FloatArray  # ... its TP collectives
    rc_cp_s: FloatArray  # ... its CP ring exchange
    rc_ep_s: FloatArray  # ... its EP all-to-alls
    host_s: FloatArray | float = 0.0  # of compute_s: MoE host wait exposure (cost/moe_host.py)
    #: of time_s: the forward pass (its compute, exposed TP / CP / EP and MoE host wait) and the
    #: weight-gradient GEMMs, the F and W of a split backward (cost/pass_split.py); the rest of
    #: time_s is B
    fwd_s: FloatArray | float = 0.0
    wgrad_s: FloatArray | float = 0.0


def layer_factors(
    job: Job, g: int, tp: ArrayLike, cp: ArrayLike, ep: ArrayLike, sp: ArrayLike,
    mbs: ArrayLike, mode: ArrayLike | str, moe: bool = False,
    options: CostOptions | None = None, etp: ArrayLike | None = None,
) -> LayerFactors:
    """Per layer, per micro-batch factors on node group `g` (docs/design.md factor form): those
    of one layer of the kind (`_one_layer`), or, when some layers of the kind have a sliding
    window that binds (flops.window_kernel_length, flash attention only), the mean over the
    kind's layers: (1 - f)·full + f·windowed, f = `ModelSpec.window_share(moe)`.

    The mean keeps the factor form (every layer of a kind costs the same, so the solver's
    tables keep their axes) and is exact for a stage of n layers of the kind holding n·f
    windowed ones, e.g. whenever the pattern's period divides n (GPT-OSS's period 2 and an
    even n). Otherwise a stage's time is off by (w_j - n·f)·(t_windowed - t_full), w_j its
    windowed layers: for a periodic pattern of q windowed layers in P, |w_j - n·f| <=
    q(P - q)/P (n = kP + r consecutive layers hold kq + [max(0, r-P+q), min(r, q)]), half a
    layer for GPT-OSS / Gemma 2, 5/6 of a layer for Gemma 3, per stage, in either direction.
    The evaluation and the solver use the same mean, so the solver's bounds stay exact.
    """
    opts = options_for(job, options)
    model = job.model
    w = model.sliding_window_left
    share = model.window_share(moe) if (
        job.recipe.flash_attention and window_kernel_length(job.seq_len, w) is not None) else 0.0
    args = (job, g, tp, cp, ep, sp, mbs, mode, moe, opts, etp)
    if share <= 0.0:
        return _one_layer(*args, window=None)
    win = _one_layer(*args, window=w)
    if share >= 1.0:
        return win
    full = _one_layer(*args, window=None)
    mixed = {f.name: (1.0 - share) * getattr(full, f.name) + share * getattr(win, f.name)
             for f in fields(LayerFactors)}
    return LayerFactors(**mixed)


def _one_layer(
    job: Job, g: int, tp: ArrayLike, cp: ArrayLike, ep: ArrayLike, sp: ArrayLike,
    mbs: ArrayLike, mode: ArrayLike | str, moe: bool, options: CostOptions,
    etp: ArrayLike | None, window: int | None,
) -> LayerFactors:
    """Per layer, per micro-batch factors of one layer (`window`: its left window, None: full
    causal attention).

    Time = GEMMs (forward, dgrad, wgrad, each at its shape's efficiency; efficiency.py) and the
    attention core (flash curve, or 2 batched GEMMs + softmax traffic without flash), x straggler.py
    + memory-bound elementwise ops at HBM bandwidth + exposed communication:
    TP: 2 all-reduces forward + 2 backward of b·s·h (Narayanan §3.2), or with SP 2 all-gathers
    + 2 reduce-scatters each way (Korthikanti §4.2.2, same volume; torchao float8 gathers in
    1 byte, `layer_ops.sp_gather_bytes`; PyTorch async TP: cost/async_tp.py); CP: ring
    exchange of the K,V chunks, (cp-1) steps forward and 2x in backward (K,V and dK,dV),
    overlapped with the attention of the chunk in flight (Megatron CP doc); EP: all-to-all
    dispatch + combine forward and backward of top_k·tokens/tp·h from each rank's
    sequence-parallel share, then gathered / scattered over the expert-TP group
    (`moe_comm.folded_moe_comm` at etp = tp; nccl-tests (n-1)/n), or with the recipe's flex
    dispatcher top_k·tokens·h with one network copy per destination node
    (`comm.flex_dispatch`); with the
    recipe's EP overlap they are exposed only beyond the layer's compute (`overlap_exposed`),
    as in the steady state of Megatron's combined 1F1B (its warm-up and cool-down micro-batches,
    which have no partner, are not told apart: a few per hundred in the published recipes).
    Full recompute replays the forward (and its TP/CP/EP comm); selective recompute replays the
    attention core (Korthikanti §5).
    `etp` (None: Megatron's default, the expert-TP size is tp) is the expert-tensor-parallel
    size of MoE parallel folding; a layer with etp != tp is costed by
    `moe_comm.folded_moe_comm`.
    A windowed layer (flash attention): its attention core is s/L causal kernels of length
    L = flops.window_kernel_length (its unmasked tiles; Transformer Engine v2.9 FusedAttention
    runs (w, 0) windows, common/fused_attn/fused_attn.cpp l. 337-356, and GPT-OSS's learnable
    softmax from cuDNN 9.13.1, l. 372-374; the sink adds one logit per row, not charged). Its
    CP exchange is charged with no attention to hide behind: TE refuses the p2p ring for
    sliding windows (context_parallel.py `attn_forward_func_with_cp` @v2.9: "a2a" or
    "all_gather" only) and its all-gather CP exposes the K, V gather ("KV all-gather between CP
    ranks is exposed", `AttnFuncWithCPAndKVAllGather`), cp - 1 ring steps, so the ring's
    unhidden cp steps forward (2x the bytes backward) are an upper bound. Memory is unchanged:
    flash attention keeps O(s) (the output and the softmax statistics) with or without a window.
    """
    opts = options
    model = job.model
    recipe = job.recipe
    nd = node(job, g)
    gpu = nd.gpu
    tp_, cp_, ep_, sp_, mbs_ = (_f(x) for x in (tp, cp, ep, sp, mbs))
    md = _mode(mode)
    etp_: FloatArray | None = None
    if etp is not None and moe:
        tp_, cp_, ep_, sp_, mbs_, md, etp_ = np.broadcast_arrays(
            tp_, cp_, ep_, sp_, mbs_, md, _f(etp))
    else:
        tp_, cp_, ep_, sp_, mbs_, md = np.broadcast_arrays(tp_, cp_, ep_, sp_, mbs_, md)
    if not moe:
        ep_ = np.ones_like(ep_)
    s = float(job.seq_len)
    tokens = mbs_ * s / cp_
    # the most-loaded EP rank's routed work over the balanced mean (--moe-load-imbalance,
    # common.routed_load; 1 on dense layers, where ep_ is 1)
    load = routed_load(job, ep_)
    dtype, slow = recipe.compute_dtype, job_compute_stretch(job)  # the slowest GPU's pace

    # ---- activations ----
    br = layer_activation_per_token(job, moe, tp_, cp_, ep_, sp_, opts, etp=etp_)
    act_none = (br.kept + br.core) * tokens
    act_sel = br.selective * tokens
    if opts.selective_policy == "op":
        act_sel = _op_sac_per_token(job, moe, tp_, sp_, br) * tokens
    ckpt = br.ckpt * tokens
    act = np.select([md == 0, md == 1], [act_none, act_sel], ckpt)
    grad_ws = 2.0 * br.largest * tokens
    work = np.where(md == 2, act_none + grad_ws,
                    np.where(md == 1, br.selective_work * tokens, 0.0) + grad_ws)
    ckpt_bytes = ckpt

    # ---- compute ----
    gemm_f = np.zeros_like(tokens)
    gemm_b = np.zeros_like(tokens)
    gemm_w = np.zeros_like(tokens)
    fwd_by_name: dict[str, FloatArray] = {}
    bwd_by_name: dict[str, FloatArray] = {}
    dgrad_by_name: dict[str, FloatArray] = {}
    for gm in (gemm_list := layer_gemms(model, moe, tokens, tp_, ep_, etp_, load)):
        gdt = fp8_casts.dtype_of(gm, dtype)
        f = slow * gm.count * gemm_time(gpu, gm.m, gm.k, gm.n, gdt) \
            * _ub_rs_stretch(gpu, opts, gm.name, tp_)
        dg = slow * gm.count * gemm_time(gpu, gm.m, gm.n, gm.k, gdt)
        wg = slow * gm.count * gemm_time(gpu, gm.k, gm.m, gm.n, gdt)
        fwd_by_name[gm.name] = f
        bwd_by_name[gm.name] = dg + wg
        dgrad_by_name[gm.name] = dg
        gemm_f = gemm_f + f
        gemm_b = gemm_b + dg + wg
        gemm_w = gemm_w + wg
    a, dqk, dv = attention_dims(model)
    length = window_kernel_length(job.seq_len, window)
    if recipe.flash_attention:
        fl = attention_core_flops(model, mbs_, job.seq_len, cp_, tp_, causal=True)
        # context parallelism runs the kernel once per ring step on s/cp-long blocks
        # (Megatron CP / torch ring attention): the curve sits at key length s/cp
        pos = s / cp_
        if length is not None:  # a windowed layer: s/L causal kernels of length L
            fl, pos = fl * length / s, np.full_like(pos, length)
        att_f, att_b = (slow * t for t in flash_attention_time(
            gpu, fl, pos, (dqk + dv) / 2.0, opts.attention_kernel))
    else:
        # two batched GEMMs (QKᵀ, attn·V) over b·a/tp heads, full (masked) s x s, plus softmax
        # (+dropout) traffic: read/write 2·a·s² bytes fwd (Megatron fused scale-mask-softmax).
        heads = mbs_ * a / tp_
        sq = s / cp_
        qk = slow * gemm_time(gpu, sq, dqk, s, "bf16", batch=heads)
        av = slow * gemm_time(gpu, sq, s, dv, "bf16", batch=heads)
        drop = 5.0 if opts.dropout else 0.0
        sm_bytes = heads * sq * s * (2 * recipe.activation_bytes + drop)
        sm_bwd = ELEMENTWISE_BWD_FACTOR * sm_bytes
        if opts.eager_attention == "scale-mask-clamp":
            # the HF eager chain, kernel by kernel (constants.EAGER_ATTN_*)
            ab_att = float(recipe.activation_bytes)
            sm_bytes = heads * sq * s * (EAGER_ATTN_FWD_PASSES * ab_att + drop)
            sm_bwd = heads * sq * s * (EAGER_ATTN_BWD_PASSES * ab_att + EAGER_ATTN_BWD_MASK_BYTES
                                       + ELEMENTWISE_BWD_FACTOR * drop)
        att_f = qk + av + hbm_time(gpu, sm_bytes)
        att_b = 2 * (qk + av) + hbm_time(gpu, sm_bwd)
    ew_f = hbm_time(gpu, elementwise_bytes_fwd(job, moe, tp_, sp_, opts, etp_, load)
                   * tokens)
    ew_b = ELEMENTWISE_BWD_FACTOR * ew_f
    ew_f, ew_b = fp8_casts.with_cast_time(job, opts, gpu, gemm_list, tp_, sp_, ew_f, ew_b)
    ub = unfused_ops.layer_unfused_bytes(job, opts, moe, tp_, mbs_)  # op by op
    ew_f, ew_b = ew_f + hbm_time(gpu, ub.fwd * tokens), ew_b + hbm_time(gpu, ub.bwd * tokens)
    # DTensor sequence-parallel layout copies (the all-gathers' in the gather dtype)
    gather_b = sp_gather_bytes(job)
    sp_copy = dtensor_sp_copy_bytes(job, tp_, sp_, opts, gather_b)
    copies_f = copies_b = hbm_time(gpu, sp_copy * tokens)
    copies_f = copies_f + autocast.autocast_cast_s(job, gpu, gemm_list)
    act_b = float(recipe.activation_bytes)
    h = model.hidden_size
    msg = tokens * h * act_b  # one b·s·h tensor
    ag_g = comm.all_gather(nd, tp_, 1, tokens * h * gather_b)  # one all-gather in the gather dtype
    sp_on = (tp_ > 1) & (sp_ > 0)
    op_sac = (md == 1) & (opts.selective_policy == "op") & sp_on
    async_on = _is_pytorch(recipe) and opts.tp_comm_overlap > 0.0
    if async_on:  # micro-pipeline TP leaves the backward's unfused reduce-scatters' copies
        atp = async_tp_layer(
            ag_g, comm.reduce_scatter(nd, tp_, 1, msg), tp_, fwd_by_name, dgrad_by_name,
            hbm_time(gpu, 2.0 * tokens * h * gather_b / tp_),
            hbm_time(gpu, msg * (1.0 + 1.0 / tp_)),
            op_sac_replayed_inputs(job, moe, gpu, tokens, tp_), 2.0 * act_b * h)
        copies_b = np.where(sp_on, hbm_time(gpu, atp.bwd_copy_bytes * tokens), copies_b)
    else:
        # op-level SAC replays both all-gathers with their layout copies (cost/async_tp.py)
        copies_b = copies_b + np.where(op_sac, hbm_time(gpu, 2 * 2.0 * gather_b * h * tokens), 0.0)
    expert_f = np.zeros_like(tokens)  # forward GPU time after the MoE host wait (moe_host)
    if moe and model.moe is not None and opts.ep_dispatcher == "allgather":
        # Megatron-Core <= 0.6's gathers and scatters (no alltoall re-sort)
        ag_f, ag_b = allgather_permute_bytes(job, tp_, ep_, etp_)
        copies_f = copies_f + hbm_time(gpu, ag_f * tokens)
        copies_b = copies_b + hbm_time(gpu, ag_b * tokens)
    elif moe and model.moe is not None:  # the alltoall dispatcher's re-sort (a copy each pass)
        resort = hbm_time(gpu, sort_chunks_bytes(
            job, tp_, ep_, etp_, opts.ep_dispatcher == "flex") * tokens)
        copies_f, copies_b = copies_f + resort, copies_b + resort
        expert_f = expert_f + resort
    # the ring's per-step merge of partial outputs and gradients (torch's fp32, TE's p2p)
    kvh_ring = a if (model.mla is not None or opts.gqa_repeat_kv) else model.kv_heads
    merge = torch_ring_merge_bytes if opts.cp_ring == "torch-allgather" else te_ring_merge_bytes
    if opts.cp_ring == "torch-allgather" or length is None:  # TE: no p2p ring for windows
        mg_f, mg_b = merge(tokens, a * dv / tp_, kvh_ring * dv / tp_, cp_)
        copies_f, copies_b = copies_f + hbm_time(gpu, mg_f), copies_b + hbm_time(gpu, mg_b)
    glu_replay = np.zeros_like(tokens)
    if moe and opts.moe_glu_clamp_bias and model.moe is not None:
        # Megatron-Core's eager clamp chain and fp32 fc2 bias (cost/moe_glu_bias.py)
        gb = glu_clamp_bias_bytes(model, recipe.activation_bytes, tp_, etp_, load)
        glu_f = hbm_time(gpu, (gb.clamp_fwd + gb.bias_fwd) * tokens)
        copies_f, expert_f = copies_f + glu_f, expert_f + glu_f
        copies_b = copies_b + hbm_time(gpu, (gb.clamp_bwd + gb.bias_bwd) * tokens)
        if "moe_act" in br.dropped:  # the checkpointed activation replays its clamp chain
            glu_replay = hbm_time(gpu, gb.clamp_fwd * tokens)
    fwd_compute = gemm_f + att_f + ew_f + copies_f
    expert_f = expert_f + fwd_by_name.get("expert_fc1", 0.0) + fwd_by_name.get("expert_fc2", 0.0)
    compute = fwd_compute + gemm_b + att_b + ew_b + copies_b
    if opts.selective_policy == "op":
        # op-level SAC replays every other forward matmul and all elementwise ops
        sac = _op_sac_recompute_s(job, moe, gpu, tokens, tp_, gemm_f)
        compute = compute + np.where(md == 1, sac + ew_f, 0.0)
    else:
        # the recipe's selective modules replayed in backward (Megatron --recompute-modules)
        replay = selective_replay_s(job, moe, br, gpu, tokens, tp_, sp_, att_f, fwd_by_name,
                                    opts)
        compute = compute + np.where(md == 1, replay + glu_replay, 0.0)
    rc_compute = fwd_compute
    if not _fused(recipe, opts):
        # eager PyTorch: the host issues kernels no faster than EAGER_HOST_S_* allows; host and
        # GPU run asynchronously, so a layer takes max(GPU time, host time) in total.
        gpu_total = compute + rc_compute
        compute = np.maximum(compute, EAGER_HOST_S_PER_LAYER)
        rc_compute = np.maximum(gpu_total, EAGER_HOST_S_PER_LAYER + EAGER_HOST_S_RECOMPUTE) \
            - compute

    # ---- TP communication ----
    ar = comm.all_reduce(nd, tp_, 1, msg)
    rs_ag = comm.reduce_scatter(nd, tp_, 1, msg) + ag_g  # gathers in the gather dtype
    # forward: attention + MLP each end in an all-reduce (or AG before + RS after with SP)
    per_pair = np.where(sp_ > 0, 2 * rs_ag, 2 * ar)
    folded = None
    if moe and model.moe is not None and (
            etp_ is not None or opts.ep_dispatcher != "allgather"):
        # a MoE block runs no collective over the attention tp group for its routed experts:
        # folded, they use the expert grid; at etp = tp the alltoall and flex dispatchers
        # gather the routed copies themselves (EP term below); only shared experts, a dense
        # tp MLP, keep theirs
        folded = etp_ != tp_ if etp_ is not None else np.zeros_like(tp_, dtype=bool)
        tp_moe = np.ones_like(folded) if opts.ep_dispatcher != "allgather" else folded
        blocks = 1.0 + (1.0 if model.moe.num_shared_experts else 0.0)
        per_pair = np.where(tp_moe, blocks * np.where(sp_ > 0, rs_ag, ar), per_pair)
    if async_on:
        # PyTorch async TP: what Inductor's micro-pipeline TP fuses and hides (cost/async_tp.py)
        plain = (sp_ <= 0) if folded is None else ((sp_ <= 0) | folded)
        tp_fwd = np.where(plain, per_pair, atp.fwd_s)
        replay_tp = np.where(plain, 2 * ag_g, atp.replay_s)
        tp_total = tp_fwd + np.where(plain, per_pair, atp.bwd_s)
    else:
        tp_fwd = per_pair * (1.0 - opts.tp_comm_overlap)
        bwd_overlap = opts.tp_comm_overlap if opts.tp_comm_overlap_bwd is None \
            else opts.tp_comm_overlap_bwd
        tp_total = tp_fwd + per_pair * (1.0 - bwd_overlap)
        replay_tp = 2 * ag_g
    tp_total = tp_total + np.where(op_sac, replay_tp, 0.0)

    # ---- CP communication (ring K/V exchange) ----
    # the ring runs inside the attention call: after a repeat_kv expansion it carries K, V at
    # every query head
    kvh = a if (model.mla is not None or opts.gqa_repeat_kv) else model.kv_heads
    kv_chunk = 2.0 * tokens * kvh * (dqk + dv) / 2.0 * act_b / tp_  # K and V of one chunk
    intra_cp = 1.0 - comm.crosses_nodes(tp_ * cp_, nd.gpus_per_node)
    hide_f, hide_b = (att_f, att_b) if length is None else (0.0 * att_f, 0.0 * att_b)
    cp_f, cp_b = ring_exchange(nd, intra_cp, kv_chunk, cp_, hide_f, hide_b, opts.cp_ring,
                               _fused(recipe, opts))
    cp_total = cp_f + cp_b

    # ---- EP communication ----
    if moe and model.moe is not None:
        flex = opts.ep_dispatcher == "flex"
        if flex or opts.ep_dispatcher == "allgather":
            # DeepEP / HybridEP: one group over tp x ep with tp·top_k routed copies of each
            # rank's tokens/tp share (token_dispatcher.py:1836-1849 @d98e8a64): the volume of
            # the whole micro-batch's top_k copies per rank (allgather: its own permutes,
            # `moe_comm.allgather_permute_bytes`, over this exchange)
            a2a = dispatch_time(job, g, ep_, tp_, tokens * model.hidden_size * act_b, flex)
            ep_f = 2 * a2a
        else:
            # the alltoall dispatcher at etp = tp moves what the folded one does: the rank's
            # tokens/tp sequence-parallel share over ep, then gathered over the expert-TP
            # group (`dispatch_postprocess`, token_dispatcher.py:741-751 @d98e8a64; SP is
            # required with TP, moe_layer.py:636); at tp 1 the same as one a2a of all tokens
            ep_f = folded_moe_comm(job, g, tokens, tp_, ep_, tp_, flex)
        if folded is not None and etp_ is not None:
            ep_f = np.where(folded, folded_moe_comm(job, g, tokens, tp_, ep_, etp_, flex), ep_f)
    else:
        ep_f = np.zeros_like(tokens)
    ep_total = 2 * ep_f
    if "moe" in br.dropped:
        # the checkpointed MoE block replays its dispatch and combine in backward
        ep_total = ep_total + np.where(md == 1, ep_f, 0.0)
    elif opts.ep_overlap and moe:
        ep_total = np.where(md == 2, ep_total,
                            ep_overlapped(ep_f / 2, fwd_compute, compute, fwd_by_name,
                                           bwd_by_name))

    host_s = np.zeros_like(tokens)
    if moe and model.moe is not None and not _is_pytorch(recipe) and _fused(recipe, opts):
        # Megatron-Core's dropless dispatchers block the host once per MoE forward
        # HybridEP / DeepEP wait on the dispatch itself: it runs before the wait
        g_post = expert_f + (ep_f / 2 if opts.ep_dispatcher == "flex" else ep_f)
        g_fwd = fwd_compute + tp_fwd + cp_f + ep_f
        # host operations are counted per call and local expert, not per token: the
        # imbalance reaches the wait only through the scaled GPU times g_post / g_fwd
        host, host_rc = moe_host.moe_host_exposed(
            job, opts, model.moe.num_experts / ep_, tp_, g_post, g_fwd - g_post,
            compute + tp_total + cp_total + ep_total - g_fwd)
        compute, host_s = compute + host, host
        replay = (md == 2) | ((md == 1) & ("moe" in br.dropped))
        rc_compute = rc_compute + np.where(replay, host_rc, 0.0)

    # calibrated fixed host / launch time of a micro-batch, each layer's share
    # (spec/calibration.py `per_microbatch_s`)
    if job.calibration is not None and job.calibration.per_microbatch_s:
        compute = compute + job.calibration.per_microbatch_s / model.num_layers
    time = compute + tp_total + cp_total + ep_total
    recompute = rc_compute + tp_fwd + cp_f + ep_f
    # the forward pass: its GPU compute, the exposed forward collectives (EP: the forward half
    # of what is exposed, all of ep_f without the EP overlap) and the MoE host wait
    fwd = fwd_compute + tp_fwd + cp_f + np.minimum(ep_f, 0.5 * ep_total) + host_s
    return LayerFactors(
        act_bytes=act, ckpt_bytes=ckpt_bytes, work_bytes=work, time_s=time,
        recompute_s=recompute, compute_s=compute, tp_s=tp_total, cp_s=cp_total, ep_s=ep_total,
        rc_compute_s=rc_compute, rc_tp_s=tp_fwd, rc_cp_s=cp_f, rc_ep_s=ep_f, host_s=host_s,
        fwd_s=fwd, wgrad_s=gemm_w,
    )
