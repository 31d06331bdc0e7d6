"""A layer's memory-bound ops: elementwise HBM traffic, DTensor sequence-parallel copies, and
the forward time selective recompute replays (used by cost/layer_factors.py)."""

from __future__ import annotations

import numpy as np

from autoparallel_cp.cost import unfused_ops
from autoparallel_cp.cost.activations import ActBreakdown
from autoparallel_cp.cost.common import (
    CostOptions,
    FloatArray,
    _fp8_lib,
    _fp32_residual,
    _fused,
    _is_pytorch,
    options_for,
)
from autoparallel_cp.cost.constants import (
    EAGER_ELEMENTWISE_FACTOR,
    EAGER_LLAMA_NORM_BYTES,
    EAGER_LLAMA_ROPE_BYTES,
    EAGER_LLAMA_SWIGLU_BYTES,
)
from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.flops import attention_dims, expert_token_factor
from autoparallel_cp.spec import GPUSpec, Job


def elementwise_bytes_fwd(job: Job, moe: bool, tp: FloatArray, sp: FloatArray,
                           options: CostOptions, etp: FloatArray | None = None,
                           load: FloatArray | float = 1.0) -> FloatArray:
    """Forward HBM traffic per token of a layer's memory-bound ops (norms, adds, activation).

    Norm: read input, write output (two pre-norms, + Gemma's two post-norms); residual add:
    read two, write one; SwiGLU read 2·ffn, write ffn (GELU: read, write ffn); rotary
    embedding on q, k (read + write); the per-head q and k norms of `qk_norm` models (Qwen3,
    Gemma 3: Megatron's `--qk-layernorm` runs q_layernorm / k_layernorm over head_dim,
    read + write of q and k); the MoE
    permute / unpermute copies of the routed tokens an expert rank holds (etp/tp of the default
    layout's with parallel folding, `flops.expert_token_factor`). PyTorch models also copy the
    bshd attention output to a contiguous tensor and, with `gqa_repeat_kv`, expand K, V to every
    query head; these plain copies are one kernel each, fused or not. A fused recipe's
    `unfused_ops` are left out here (`unfused_ops.unfused_op_bytes`).
    `load` (`common.routed_load`, --moe-load-imbalance) multiplies the most-loaded EP rank's
    routed terms (the routed experts' activation; the permute copies where they act on received
    copies: the flex dispatcher); norms, adds, rotary and the shared experts' activation see
    every token once.
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
    if model.post_norms:
        # Gemma's post-attention / post-feedforward norms: read the sublayer output (activation
        # dtype), write the normed one
        norms = norms + 2 * 2 * ab * h * rep
    adds = 2 * 3 * res * h * rep
    if moe and model.moe is not None:
        # routed experts' activation: per-rank routed work (x load); shared: every token once
        ffn = model.moe.top_k * model.moe.expert_ffn_hidden_size * load + (
            model.moe.num_shared_experts * model.moe.shared_ffn)
        if options.ep_dispatcher != "allgather":
            # permute + unpermute copies of the routed tokens (the allgather dispatcher's own
            # gathers and scatters are `moe_comm.allgather_permute_bytes`)
            # Imbalance: the alltoall dispatcher permutes the rank's own tokens' top_k copies
            # before its dispatch and unpermutes them after the combine (token_dispatcher.py
            # `MoEAlltoAllTokenDispatcher.dispatch_preprocess` / `combine_postprocess`): the
            # same count on every rank whatever the routing, no scaling. The flex dispatcher
            # permutes the received copies after its dispatch and unpermutes them before its
            # combine (`MoEFlexTokenDispatcher.dispatch_postprocess` / `combine_preprocess`):
            # the rank's routed work, x load.
            own = load if options.ep_dispatcher == "flex" else 1.0
            adds = adds + 4 * ab * h * model.moe.top_k * expert_token_factor(tp, etp) * own
    else:
        ffn = model.ffn_hidden_size
    unf = unfused_ops.active_ops(job, options)  # costed by unfused_ops
    act = (0 if unfused_ops.swiglu_unfused(unf, model, moe) else 2 + model.gated_mlp) \
        * ab * ffn / tp
    rope = 2 * ab * (a + kvh) * dqk / tp if model.position_embedding == "rope" \
        and unfused_ops.rope_unfused(unf, model) is None else 0.0 * tp
    qk = (a + kvh) * dqk / tp if model.qk_norm and model.mla is None else 0.0 * tp
    drop = (3 * ab * h * rep) * (3 if options.dropout else 0)
    copies = 0.0 * tp
    if _is_pytorch(recipe) and recipe.flash_attention:
        # bshd attention output made contiguous for the out projection (read + write)
        copies = copies + 2 * ab * a * dqk / tp
    if options.gqa_repeat_kv and model.mla is None and kvh < a:
        # repeat_kv: read K, V at kv heads, write them at all heads
        copies = copies + ab * 2 * (kvh + a) * dqk / tp
    total = norms + adds + act + rope + drop + 2 * ab * qk
    if not _fused(recipe, options):
        if options.eager_ops == "llama-upcast" and model.norm == "rmsnorm":
            # op by op (EAGER_LLAMA_* below): fp32-upcast RMSNorm, complex/rotate-half RoPE in
            # fp32, silu then mul; residual adds and dropout as fused (one kernel each anyway)
            total = ((4 if model.post_norms else 2) * EAGER_LLAMA_NORM_BYTES * h * rep
                     + EAGER_LLAMA_NORM_BYTES * qk + adds + drop
                     + (EAGER_LLAMA_SWIGLU_BYTES if model.gated_mlp
                        else EAGER_ELEMENTWISE_FACTOR * 2 * ab) * ffn / tp
                     + (EAGER_LLAMA_ROPE_BYTES * (a + kvh) * dqk / tp
                        if model.position_embedding == "rope" else 0.0 * tp))
        else:
            total = total * EAGER_ELEMENTWISE_FACTOR
    return total + copies  # plain copies: one kernel, fused or not


def dtensor_sp_copy_bytes(job: Job, tp: FloatArray, sp: FloatArray,
                           options: CostOptions, gather_bytes: float | None = None) -> FloatArray:
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
    `gather_bytes`: bytes per element of the gathered tensors (None: the activation dtype;
    see `sp_gather_bytes`).
    """
    recipe = job.recipe
    on = _is_pytorch(recipe) and options.tp_comm_overlap == 0.0
    ab = float(recipe.activation_bytes)
    gb = ab if gather_bytes is None else gather_bytes
    per = 2 * 2 * (gb + ab) * job.model.hidden_size
    return np.where(on & (tp > 1) & (sp > 0), per, 0.0)


def sp_gather_bytes(job: Job) -> float:
    """Bytes per element of the sequence-parallel all-gathers (forward: before QKV and the MLP;
    backward: the gradients before the output and down projections).

    torchao float8 tensor parallelism (torchtitan's `enable_float8_tensorwise_tp`, models/
    llama3/parallelize_llama.py @820504e) casts to float8 before each Shard -> Replicate
    redistribute: `PrepareFloat8ModuleInput` the attention / MLP input (one float8 gather
    shared by the QKV or w1/w3 linears), and `Float8RowwiseParallel`'s output hook
    (`_NoopFwToFloat8BwDynamic`, a no-op forward) the incoming gradient before its all-gather
    (torchao float8/float8_tensor_parallel.py @0e0fba8): 1 byte. The reduce-scatters stay
    bf16.
    """
    recipe = job.recipe
    if recipe.compute_dtype == "fp8" and _is_pytorch(recipe) and _fp8_lib(recipe) == "torchao":
        return 1.0
    return float(recipe.activation_bytes)


def selective_replay_s(job: Job, moe: bool, br: ActBreakdown, gpu: GPUSpec,
                        tokens: FloatArray, tp: FloatArray, sp: FloatArray, att_f: FloatArray,
                        fwd: dict[str, FloatArray], options: CostOptions | None = None
                        ) -> FloatArray:
    """Forward time the selective modules (`br.dropped`) replay in backward, per micro-batch.

    core_attn: the attention core (Korthikanti §5); layernorm: both norms (read the input,
    write the output); moe_act: the routed copies' activation (SwiGLU reads 2·ffn and writes
    ffn per copy, GELU one each); mla_up_proj: the q / kv up-projection GEMMs; mlp, moe,
    shared_experts: their forward GEMMs and activation (moe: the router too; its all-to-alls
    are added by the caller). Megatron-Core transformer_config.py `recompute_modules`.
    With `norm_recompute_drops_cache` (DeepSeek-V3 §3.2.3: every RMSNorm) the MLA latent
    norms replay too; with `moe_swiglu_fp8_input` (§3.3.3 (2)) moe_act replays the shared
    experts' SwiGLU as well (the re-quantization to fp8 rides on those passes: not apart).
    """
    opts = options_for(job, options)
    model = job.model
    ab = float(job.recipe.activation_bytes)
    res = 4.0 if _fp32_residual(job.recipe) else ab
    h = model.hidden_size
    rep = np.where(sp > 0, 1.0 / tp, 1.0)
    act_rw = 3.0 if model.gated_mlp else 2.0
    t = np.zeros_like(tokens)

    def gemms(*names: str) -> FloatArray:
        return sum((fwd[n] for n in names if n in fwd), np.zeros_like(tokens))

    d = br.dropped
    if "core_attn" in d:
        t = t + att_f
    if "layernorm" in d:
        t = t + hbm_time(gpu, 2 * (res + ab) * h * rep * tokens)
        if opts.norm_recompute_drops_cache and model.mla is not None:
            lat = model.mla.kv_lora_rank + (model.mla.q_lora_rank or 0)
            t = t + hbm_time(gpu, 2 * ab * lat * tokens)  # read c, write norm(c)
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
            shared_too = opts.moe_swiglu_fp8_input and "shared_experts" not in d
            t = t + routed_act + (shared_act if shared_too else 0.0)
        if "shared_experts" in d:
            t = t + gemms("shared_fc1", "shared_fc2") + shared_act
    return t
