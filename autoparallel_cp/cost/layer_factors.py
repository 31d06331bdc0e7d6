"""Per-layer, per-micro-batch factors: saved bytes and time of forward, backward and recompute,
with the TP / CP / EP collectives each layer runs and how much of them compute hides.

Kept whole: `layer_factors` is one pass over a layer's compute, collectives and host-bound
terms that share its intermediate GPU times; split up it would pass a dozen arrays around."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel_cp.cost import comm, moe_host, unfused_ops
from autoparallel_cp.cost.activations import (
    ActBreakdown,
    _op_sac_per_token,
    _op_sac_recompute_s,
    layer_activation_per_token,
)
from autoparallel_cp.cost.common import (
    ArrayLike,
    CostOptions,
    FloatArray,
    _f,
    _fp32_residual,
    _fused,
    _is_pytorch,
    _mode,
    node,
    options_for,
)
from autoparallel_cp.cost.constants import (
    EAGER_ELEMENTWISE_FACTOR,
    EAGER_HOST_S_PER_LAYER,
    EAGER_HOST_S_RECOMPUTE,
    EAGER_LLAMA_NORM_BYTES,
    EAGER_LLAMA_ROPE_BYTES,
    EAGER_LLAMA_SWIGLU_BYTES,
    ELEMENTWISE_BWD_FACTOR,
)
from autoparallel_cp.cost.cp_ring import ring_exchange, torch_ring_merge_bytes
from autoparallel_cp.cost.efficiency import flash_attention_time, gemm_time, hbm_time
from autoparallel_cp.cost.flops import (
    attention_core_flops,
    attention_dims,
    expert_token_factor,
    layer_gemms,
)
from autoparallel_cp.cost.moe_comm import (
    allgather_permute_bytes,
    dispatch_time,
    ep_overlapped,
    folded_moe_comm,
    sort_chunks_bytes,
)
from autoparallel_cp.cost.moe_glu_bias import glu_clamp_bias_bytes
from autoparallel_cp.spec import GPUSpec, Job

# ---------------------------------------------------------------------------------------------
# Per-layer factors
# ---------------------------------------------------------------------------------------------


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


def _elementwise_bytes_fwd(job: Job, moe: bool, tp: FloatArray, sp: FloatArray,
                           options: CostOptions, etp: FloatArray | None = None) -> FloatArray:
    """Forward HBM traffic per token of a layer's memory-bound ops (norms, adds, activation).

    Norm: read input, write output; residual add: read two, write one; SwiGLU read 2·ffn,
    write ffn (GELU: read, write ffn); rotary embedding on q, k (read + write); the MoE
    permute / unpermute copies of the routed tokens an expert rank holds (etp/tp of the default
    layout's with parallel folding, `flops.expert_token_factor`). PyTorch models also copy the
    bshd attention output to a contiguous tensor and, with `gqa_repeat_kv`, expand K, V to every
    query head; these plain copies are one kernel each, fused or not. A fused recipe's
    `unfused_ops` are left out here (`unfused_ops.unfused_op_bytes`).
    """
    model = job.model
    recipe = job.recipe
    ab = float(recipe.activation_bytes)
    res = 4.0 if _fp32_residual(recipe) else ab
    h = model.hidden_size
    rep = np.where(sp > 0, 1.0 / tp, 1.0)
    a, dqk, _ = attention_dims(model)
    kvh = a if model.mla is not None else model.kv_heads
    norms = 2 * (res + ab) * h * rep
    adds = 2 * 3 * res * h * rep
    if moe and model.moe is not None:
        ffn = model.moe.top_k * model.moe.expert_ffn_hidden_size + (
            model.moe.num_shared_experts * model.moe.shared_ffn)
        if options.ep_dispatcher != "allgather":
            # permute + unpermute copies of the routed tokens (the allgather dispatcher's own
            # gathers and scatters are `moe_comm.allgather_permute_bytes`)
            adds = adds + 4 * ab * h * model.moe.top_k * expert_token_factor(tp, etp)
    else:
        ffn = model.ffn_hidden_size
    unf = unfused_ops.active_ops(job, options)  # costed by unfused_ops
    act = (0 if unfused_ops.swiglu_unfused(unf, model, moe) else 2 + (model.mlp == "swiglu")) \
        * ab * ffn / tp
    rope = 2 * ab * (a + kvh) * dqk / tp if model.position_embedding == "rope" \
        and unfused_ops.rope_unfused(unf, model) is None else 0.0 * tp
    drop = (3 * ab * h * rep) * (3 if options.dropout else 0)
    copies = 0.0 * tp
    if _is_pytorch(recipe) and recipe.flash_attention:
        # bshd attention output made contiguous for the out projection (read + write)
        copies = copies + 2 * ab * a * dqk / tp
    if options.gqa_repeat_kv and model.mla is None and kvh < a:
        # repeat_kv: read K, V at kv heads, write them at all heads
        copies = copies + ab * 2 * (kvh + a) * dqk / tp
    total = norms + adds + act + rope + drop
    if not _fused(recipe, options):
        if options.eager_ops == "llama-upcast" and model.norm == "rmsnorm":
            # op by op (EAGER_LLAMA_* below): fp32-upcast RMSNorm, complex/rotate-half RoPE in
            # fp32, silu then mul; residual adds and dropout as fused (one kernel each anyway)
            total = (2 * EAGER_LLAMA_NORM_BYTES * h * rep + adds + drop
                     + (EAGER_LLAMA_SWIGLU_BYTES if model.mlp == "swiglu"
                        else EAGER_ELEMENTWISE_FACTOR * 2 * ab) * ffn / tp
                     + (EAGER_LLAMA_ROPE_BYTES * (a + kvh) * dqk / tp
                        if model.position_embedding == "rope" else 0.0 * tp))
        else:
            total = total * EAGER_ELEMENTWISE_FACTOR
    return total + copies  # plain copies: one kernel, fused or not


def _dtensor_sp_copy_bytes(job: Job, tp: FloatArray, sp: FloatArray,
                           options: CostOptions) -> FloatArray:
    """HBM bytes per token of the copies PyTorch's DTensor sequence parallelism adds around
    its collectives, per layer and per pass (forward; backward runs as many).

    torchtitan shards the [batch, seq, hidden] activations on dim 1 (`SequenceParallel`,
    `PrepareModuleInput(input_layouts=Shard(1))`); NCCL gathers and scatters along dim 0, so
    torch's functional collectives copy: an all-gather along dim 1 ends in
    `torch.cat(chunk(out, tp, dim=0), dim=1)` and a reduce-scatter along it begins with
    `torch.cat(chunk(x, tp, dim=1))` (torch/distributed/_functional_collectives.py
    `all_gather_tensor` / `reduce_scatter_tensor`). Each reads and writes the full b·s·h tensor:
    2 all-gathers (before QKV and the MLP) + 2 reduce-scatters (after the output projection
    and the MLP) = 4 x 2 x h x activation bytes per token of the layer's sequence. Megatron
    gathers along its leading sequence dim (no copy); async TP (`tp_comm_overlap` > 0 in a
    PyTorch recipe) runs the fused all-gather-matmul / matmul-reduce-scatter instead.
    """
    recipe = job.recipe
    on = _is_pytorch(recipe) and options.tp_comm_overlap == 0.0
    per = 4 * 2 * float(recipe.activation_bytes) * job.model.hidden_size
    return np.where(on & (tp > 1) & (sp > 0), per, 0.0)


def _selective_replay_s(job: Job, moe: bool, br: ActBreakdown, gpu: GPUSpec,
                        tokens: FloatArray, tp: FloatArray, sp: FloatArray, att_f: FloatArray,
                        fwd: dict[str, FloatArray]) -> FloatArray:
    """Forward time the selective modules (`br.dropped`) replay in backward, per micro-batch.

    core_attn: the attention core (Korthikanti §5); layernorm: both norms (read the input,
    write the output); moe_act: the routed copies' activation (SwiGLU reads 2·ffn and writes
    ffn per copy, GELU one each); mla_up_proj: the q / kv up-projection GEMMs; mlp, moe,
    shared_experts: their forward GEMMs and activation (moe: the router too; its all-to-alls
    are added by the caller). Megatron-Core transformer_config.py `recompute_modules`.
    """
    model = job.model
    ab = float(job.recipe.activation_bytes)
    res = 4.0 if _fp32_residual(job.recipe) else ab
    h = model.hidden_size
    rep = np.where(sp > 0, 1.0 / tp, 1.0)
    act_rw = 3.0 if model.mlp == "swiglu" else 2.0
    t = np.zeros_like(tokens)

    def gemms(*names: str) -> FloatArray:
        return sum((fwd[n] for n in names if n in fwd), np.zeros_like(tokens))

    d = br.dropped
    if "core_attn" in d:
        t = t + att_f
    if "layernorm" in d:
        t = t + hbm_time(gpu, 2 * (res + ab) * h * rep * tokens)
    if "mla_up_proj" in d:
        t = t + gemms("q_up", "kv_up")
    if "mlp" in d:
        t = t + gemms("mlp_fc1", "mlp_fc2") \
            + hbm_time(gpu, act_rw * ab * model.ffn_hidden_size / tp * tokens)
    if moe and model.moe is not None:
        mo = model.moe
        routed_act = hbm_time(gpu, mo.top_k * act_rw * ab * mo.expert_ffn_hidden_size / tp
                              * tokens)
        shared_act = hbm_time(gpu, act_rw * ab * mo.num_shared_experts * mo.shared_ffn / tp
                              * tokens)
        if "moe" in d:
            t = t + gemms("router", "expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2") \
                + routed_act + shared_act
        if "moe_act" in d:
            t = t + routed_act
        if "shared_experts" in d:
            t = t + gemms("shared_fc1", "shared_fc2") + shared_act
    return t


def layer_factors(
    job: Job, g: int, tp: ArrayLike, cp: ArrayLike, ep: ArrayLike, sp: ArrayLike,
    mbs: ArrayLike, mode: ArrayLike | str, moe: bool = False,
    options: CostOptions | None = None, etp: ArrayLike | None = None,
) -> LayerFactors:
    """Per layer, per micro-batch factors on node group `g` (docs/design.md factor form).

    Time = GEMMs (forward, dgrad, wgrad, each at its shape's efficiency; efficiency.py)
    + attention core (flash curve, or two batched GEMMs + softmax traffic without flash)
    + memory-bound elementwise ops at HBM bandwidth + exposed communication:
    TP: 2 all-reduces forward + 2 backward of b·s·h (Narayanan §3.2), or with SP 2 all-gathers
    + 2 reduce-scatters each way (Korthikanti §4.2.2, same volume); CP: ring exchange of the
    K,V chunks, (cp-1) steps forward and 2x in backward (K,V and dK,dV), overlapped with the
    attention of the chunk in flight (Megatron CP doc); EP: all-to-all dispatch + combine forward
    and backward of top_k·tokens·h (llm-analysis, nccl-tests (n-1)/n), or with the recipe's
    flex dispatcher one network copy per destination node (`comm.flex_dispatch`); with the
    recipe's EP overlap they are exposed only beyond the layer's compute (`overlap_exposed`),
    as in the steady state of Megatron's combined 1F1B (its warm-up and cool-down micro-batches,
    which have no partner, are not told apart: a few per hundred in the published recipes).
    Full recompute replays the forward (and its TP/CP/EP comm); selective recompute replays the
    attention core (Korthikanti §5).
    `etp` (None: Megatron's default, the expert-TP size is tp) is the expert-tensor-parallel
    size of MoE parallel folding; a layer with etp != tp is costed by
    `moe_comm.folded_moe_comm`.
    """
    opts = options_for(job, options)
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
    dtype = recipe.compute_dtype

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
    fwd_by_name: dict[str, FloatArray] = {}
    bwd_by_name: dict[str, FloatArray] = {}
    for gm in layer_gemms(model, moe, tokens, tp_, ep_, etp_):
        f = gm.count * gemm_time(gpu, gm.m, gm.k, gm.n, dtype)
        dg = gm.count * gemm_time(gpu, gm.m, gm.n, gm.k, dtype)
        wg = gm.count * gemm_time(gpu, gm.k, gm.m, gm.n, dtype)
        fwd_by_name[gm.name] = f
        bwd_by_name[gm.name] = dg + wg
        gemm_f = gemm_f + f
        gemm_b = gemm_b + dg + wg
    a, dqk, dv = attention_dims(model)
    if recipe.flash_attention:
        fl = attention_core_flops(model, mbs_, job.seq_len, cp_, tp_, causal=True)
        # context parallelism runs the kernel once per ring step on s/cp-long blocks
        # (Megatron CP / torch ring attention): the curve sits at key length s/cp
        att_f, att_b = flash_attention_time(gpu, fl, s / cp_, (dqk + dv) / 2.0,
                                            opts.attention_kernel)
    else:
        # two batched GEMMs (QKᵀ, attn·V) over b·a/tp heads, full (masked) s x s, plus softmax
        # (+dropout) traffic: read/write 2·a·s² bytes fwd (Megatron fused scale-mask-softmax).
        heads = mbs_ * a / tp_
        sq = s / cp_
        qk = gemm_time(gpu, sq, dqk, s, "bf16", batch=heads)
        av = gemm_time(gpu, sq, s, dv, "bf16", batch=heads)
        sm_bytes = heads * sq * s * (2 * recipe.activation_bytes + (5.0 if opts.dropout else 0.0))
        att_f = qk + av + hbm_time(gpu, sm_bytes)
        att_b = 2 * (qk + av) + hbm_time(gpu, ELEMENTWISE_BWD_FACTOR * sm_bytes)
    ew_f = hbm_time(gpu, _elementwise_bytes_fwd(job, moe, tp_, sp_, opts, etp_) * tokens)
    ew_b = ELEMENTWISE_BWD_FACTOR * ew_f
    ub = unfused_ops.layer_unfused_bytes(job, opts, moe, tp_, mbs_)  # op by op
    ew_f, ew_b = ew_f + hbm_time(gpu, ub.fwd * tokens), ew_b + hbm_time(gpu, ub.bwd * tokens)
    copies = hbm_time(gpu, _dtensor_sp_copy_bytes(job, tp_, sp_, opts) * tokens)
    copies_f = copies_b = copies
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
    if opts.cp_ring == "torch-allgather":  # torch ring attention's fp32 merge per step
        kvh_ring = a if (model.mla is not None or opts.gqa_repeat_kv) else model.kv_heads
        mg_f, mg_b = torch_ring_merge_bytes(tokens, a * dv / tp_, kvh_ring * dv / tp_, cp_)
        copies_f, copies_b = copies_f + hbm_time(gpu, mg_f), copies_b + hbm_time(gpu, mg_b)
    glu_replay = np.zeros_like(tokens)
    if moe and opts.moe_glu_clamp_bias and model.moe is not None:
        # Megatron-Core's eager clamp chain and fp32 fc2 bias (cost/moe_glu_bias.py)
        gb = glu_clamp_bias_bytes(model, recipe.activation_bytes, tp_, etp_)
        copies_f = copies_f + hbm_time(gpu, (gb.clamp_fwd + gb.bias_fwd) * tokens)
        expert_f = expert_f + hbm_time(gpu, (gb.clamp_fwd + gb.bias_fwd) * tokens)
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
        replay = _selective_replay_s(job, moe, br, gpu, tokens, tp_, sp_, att_f, fwd_by_name)
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
    act_b = float(recipe.activation_bytes)
    msg = tokens * model.hidden_size * act_b  # one b·s·h tensor
    ar = comm.all_reduce(nd, tp_, 1, msg)
    rs_ag = comm.reduce_scatter(nd, tp_, 1, msg) + comm.all_gather(nd, tp_, 1, msg)
    # forward: attention + MLP each end in an all-reduce (or AG before + RS after with SP)
    per_pair = np.where(sp_ > 0, 2 * rs_ag, 2 * ar)
    folded = None
    if etp_ is not None and model.moe is not None:
        folded = etp_ != tp_
        # a folded MoE block runs no collective over the attention tp group for its routed
        # experts (they use the expert grid); only shared experts, a dense tp MLP, keep theirs
        blocks = 1.0 + (1.0 if model.moe.num_shared_experts else 0.0)
        per_pair = np.where(folded, blocks * np.where(sp_ > 0, rs_ag, ar), per_pair)
    tp_fwd = per_pair * (1.0 - opts.tp_comm_overlap)
    bwd_overlap = opts.tp_comm_overlap if opts.tp_comm_overlap_bwd is None \
        else opts.tp_comm_overlap_bwd
    tp_total = tp_fwd + per_pair * (1.0 - bwd_overlap)

    # ---- CP communication (ring K/V exchange) ----
    # the ring runs inside the attention call: after a repeat_kv expansion it carries K, V at
    # every query head
    kvh = a if (model.mla is not None or opts.gqa_repeat_kv) else model.kv_heads
    kv_chunk = 2.0 * tokens * kvh * (dqk + dv) / 2.0 * act_b / tp_  # K and V of one chunk
    intra_cp = 1.0 - comm.crosses_nodes(tp_ * cp_, nd.gpus_per_node)
    cp_f, cp_b = ring_exchange(nd, intra_cp, kv_chunk, cp_, att_f, att_b, opts.cp_ring,
                               _fused(recipe, opts))
    cp_total = cp_f + cp_b

    # ---- EP communication ----
    if moe and model.moe is not None:
        flex = opts.ep_dispatcher == "flex"
        a2a = dispatch_time(job, g, ep_, tp_, tokens * model.hidden_size * act_b, flex)
        ep_f = 2 * a2a
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
        half = ep_f / 2  # HybridEP / DeepEP wait on the dispatch itself: it runs before
        g_post = expert_f + np.where(opts.ep_dispatcher == "flex", half, ep_f)
        g_fwd = fwd_compute + tp_fwd + cp_f + ep_f
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
    return LayerFactors(
        act_bytes=act, ckpt_bytes=ckpt_bytes, work_bytes=work, time_s=time,
        recompute_s=recompute, compute_s=compute, tp_s=tp_total, cp_s=cp_total, ep_s=ep_total,
        rc_compute_s=rc_compute, rc_tp_s=tp_fwd, rc_cp_s=cp_f, rc_ep_s=ep_f, host_s=host_s,
    )
