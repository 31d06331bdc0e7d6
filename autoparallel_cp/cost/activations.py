"""Activation memory per token of one layer, op by op (Korthikanti et al. 2022 §4; op-level SAC)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autoparallel_cp.cost.common import (
    ArrayLike,
    CostOptions,
    FloatArray,
    _f,
    _fp32_residual,
    _fused,
    _is_pytorch,
    _te_fp8,
    options_for,
    routed_load,
)
from autoparallel_cp.cost.efficiency import gemm_time
from autoparallel_cp.cost.flops import attention_dims, expert_token_factor
from autoparallel_cp.cost.moe_glu_bias import glu_clamp_bias_bytes
from autoparallel_cp.cost.straggler import job_compute_stretch
from autoparallel_cp.cost.unfused_ops import swiglu_unfused
from autoparallel_cp.spec import (
    ClusterSpec,
    GPUSpec,
    Job,
    LinkSpec,
    ModelSpec,
    NodeGroup,
    TrainingRecipe,
)

# ---------------------------------------------------------------------------------------------
# Activations (op by op)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActBreakdown:
    """Bytes per token saved by one layer, split into the parts recompute modes act on."""

    kept: FloatArray  # saved in every mode except full (projections, norms, MLP)
    core: FloatArray  # attention core intermediates dropped by selective recompute (s² terms)
    ckpt: FloatArray  # layer input kept under full recompute
    largest: FloatArray  # largest single saved tensor (sets the backward working set)
    #: bytes per token each of the recipe's selective `recompute_modules` drops (the
    #: "attention" policy; "core_attn" drops `core`), without double counting ("moe" covers
    #: "moe_act" and "shared_experts")
    dropped: dict[str, FloatArray] = field(default_factory=dict)

    @property
    def selective(self) -> FloatArray:
        """Bytes per token saved under `recompute=selective` (kept + core - dropped)."""
        return self.kept + self.core - sum(self.dropped.values(), np.zeros_like(self.kept))

    @property
    def selective_work(self) -> FloatArray:
        """Largest module the selective replay rebuilds at once (backward working set)."""
        return np.maximum.reduce([np.zeros_like(self.kept), *self.dropped.values()])


def layer_activation_per_token(
    job: Job, moe: bool, tp: ArrayLike, cp: ArrayLike, ep: ArrayLike, sp: ArrayLike,
    options: CostOptions | None = None, etp: ArrayLike | None = None,
) -> ActBreakdown:
    """Bytes per token (per rank's tokens) one layer saves for backward, op by op.

    Korthikanti et al. 2022 §4.1 (Eq. 1) generalised: per token and layer
    - norm 1 input (residual dtype), QKV input (bf16) - replicated over tp unless SP;
    - Q, K, V (GQA: K,V have kv_heads), attention output, softmax statistics - /tp;
      without flash attention the softmax output 2·a·s, dropout mask a·s and dropout output
      2·a·s (Korthikanti's 5as/h term) - /tp, dropped by selective recompute;
    - output-projection input (flash: the attention output itself for Megatron's sbhd layout;
      PyTorch bshd makes a contiguous copy), attention dropout mask (1 B) - replicated;
    - norm 2 input, MLP input - replicated; GELU: fc1 output + GELU output (2·2·ffn);
      SwiGLU: fc1 output (gate+up, 2·2·ffn) + down-proj input (2·ffn) (+ silu output 2·ffn when
      unfused); MLP dropout mask - /tp except masks;
    - MoE: router logits and probabilities in fp32, dispatched tokens (top_k copies of the
      fc1 input), expert hidden states per routed copy, and for the probabilities' gradient
      (behaviour `moe_prob_scaling`) the fp32 probability of each routed copy where the
      experts' activation applies it (Megatron-Core >= 0.13), the expert outputs where the
      combine does;
      with an expert-TP size `etp` (parallel folding) an expert rank holds etp/tp times the
      default layout's dispatched tokens (`flops.expert_token_factor`), each expert hidden
      state 1/etp wide, so only the fc1 input changes per rank token;
    - MLA: compressed q / kv latents and their norms (replicated), then Q, K, V per head.
    PyTorch autocast keeps the residual stream and norm inputs in fp32 (4 B) since the
    embedding output is fp32; Megatron keeps them in bf16.
    FP8 with Transformer Engine (behaviour `fp8_linear` "te"; the default of Megatron recipes,
    and llm-foundry's fp8 runs use te.Linear): every TE linear layer
    casts its input to fp8 and saves that fp8 copy (1 B) for the weight gradient instead of the
    bf16 input (transformer_engine/pytorch/module/layernorm_linear.py and linear.py save the
    quantized `ln_out` / `inputmat`): the QKV and fc1 inputs (fused into the norm) and the fc2
    input (the activation output, which nothing else keeps) drop to 1 B per element, the
    output projection adds a 1 B copy beside the bf16 attention output the flash backward keeps.
    torchao float8 (`fp8_linear` "torchao", the default of PyTorch recipes) saves the
    high-precision inputs and re-casts in backward, so nothing changes there.
    DeepSeek-V3's FP8 framework (arXiv 2412.19437; behaviour fields, spec/recipe.py):
    `attn_out_cache_bytes` replaces the bf16 attention output and TE's fp8 copy by one copy
    (E5M6, 1.5 B: §3.3.3 (1)); `moe_swiglu_fp8_input` caches every MoE SwiGLU input (the
    routed and shared fc1 outputs) at 1 B and lets "moe_act" drop the shared expert's
    activation output too (§3.3.3 (2)); `norm_recompute_drops_cache` makes "layernorm" drop
    the norm outputs in the form the next linear caches them (fp8 copies included) and the MLA
    latent-norm outputs, the up-projections' inputs (§3.2.3).
    With context parallelism tokens per rank are s/cp (the caller multiplies by them) and the
    non-flash s² terms see the full key length s.
    """
    options = options_for(job, options)
    model = job.model
    recipe = job.recipe
    tp_ = _f(tp)
    sp_ = _f(sp)
    cp_ = _f(cp)
    ep_ = _f(ep)
    shape = np.broadcast_shapes(tp_.shape, sp_.shape, cp_.shape, ep_.shape)
    one = np.ones(shape)
    rep = np.where(sp_ > 0, 1.0 / tp_, 1.0) * one  # replicated parts are sharded by SP
    ab = float(recipe.activation_bytes)
    res = 4.0 if _fp32_residual(recipe) else ab
    h = model.hidden_size
    drop = 1.0 if options.dropout else 0.0
    fused = _fused(recipe, options)
    a, dqk, dv = attention_dims(model)
    s_kv = float(job.seq_len)
    # bytes per element of a saved linear-layer input (TE fp8 saves the fp8 copy)
    lin = 1.0 if _te_fp8(recipe) else ab

    kept = np.zeros(shape)
    core = np.zeros(shape)
    largest = np.zeros(shape)
    # --- attention block ---
    kept = kept + (res * h + lin * h) * rep  # norm-1 input, QKV-projection input
    # the norms' outputs are what the next linear saves only where it keeps bf16 inputs (TE
    # fp8 linears keep their own fp8 copy, and the bf16 norm output is not saved at all)
    norm_outs = 2 * lin * h * rep if lin == ab else np.zeros(shape)
    if options.norm_recompute_drops_cache:
        norm_outs = 2 * lin * h * rep  # QKV and MLP inputs, fp8 copies too (§3.2.3)
    mla_qkv = np.zeros(shape)
    if model.mla is not None:
        m = model.mla
        lat = m.kv_lora_rank + (m.q_lora_rank or 0)
        kept = kept + 2 * ab * lat * one  # latent norm inputs + up-projection inputs (replicated)
        if options.norm_recompute_drops_cache:
            norm_outs = norm_outs + ab * lat * one  # the latent norms' outputs (§3.2.3)
        q_bytes = ab * a * dqk / tp_
        k_bytes = ab * a * dqk / tp_
        v_bytes = ab * a * dv / tp_
        mla_qkv = (q_bytes + k_bytes + v_bytes) * one
    else:
        kv = a if (options.gqa_repeat_kv and recipe.flash_attention) else model.kv_heads
        q_bytes = ab * a * dqk / tp_
        k_bytes = ab * kv * dqk / tp_
        v_bytes = ab * kv * dv / tp_
        if model.qk_norm:
            kept = kept + q_bytes + k_bytes  # pre-norm q, k
    out_bytes = ab * a * dv / tp_
    one_copy = options.attn_out_cache_bytes
    if one_copy is not None and recipe.flash_attention:
        # one copy for the attention backward and the out-projection's wgrad (§3.3.3 (1))
        kept = kept + q_bytes + k_bytes + v_bytes + one_copy * a * dv / tp_ + 4.0 * a / tp_
    elif recipe.flash_attention:
        # q, k, v, output (= out-proj input in sbhd layout), fp32 logsumexp per head
        kept = kept + q_bytes + k_bytes + v_bytes + out_bytes + 4.0 * a / tp_
        if _is_pytorch(recipe) and lin == ab:
            # transpose(1,2).reshape copy fed to the out projection (a TE fp8 linear saves
            # only its fp8 cast of it, added below)
            kept = kept + out_bytes
    else:
        kept = kept + q_bytes + k_bytes + v_bytes + out_bytes
        core = core + (ab + drop * (1.0 + ab)) * a * s_kv / tp_ * one
        if options.eager_attention == "scale-mask-clamp":
            # `torch.max(scores, finfo.min)` saves its input, the masked scores, for its
            # gradient (`maximum`: self == other, self < other); the softmax output above
            # is the one the AV matmul saves too
            core = core + ab * a * s_kv / tp_ * one
    if lin < ab and not (one_copy is not None and recipe.flash_attention):
        kept = kept + out_bytes * lin / ab  # TE's fp8 copy of the out-projection input
    kept = kept + drop * h * rep  # attention-output dropout mask
    if model.post_norms:
        # Gemma's post-attention and post-feedforward norms save their inputs (the sublayer
        # outputs; RMSNorm backward needs x: Korthikanti §4.1's norm-input term)
        kept = kept + 2 * ab * h * rep
    # --- MLP block ---
    kept = kept + (res * h + lin * h) * rep  # norm-2 input, MLP / router input
    swiglu = model.gated_mlp

    def mlp_bytes(ffn: float, eager_silu: bool = False,
                  fc1_out: float = ab) -> tuple[FloatArray, FloatArray]:
        if swiglu:
            # fc1 output (gate + up), fc2 input, silu output when unfused (the mul saves it)
            per = (2 * fc1_out + lin + (0.0 if fused and not eager_silu else ab)) * ffn
            big = 2 * ab * ffn
        else:
            per = (ab + lin) * ffn  # fc1 output, GELU output (= fc2 input)
            big = ab * ffn
        return per / tp_ * one, big / tp_ * one

    mods = set(options.recompute_modules) if options.selective_policy == "attention" else set()
    dropped: dict[str, FloatArray] = {}
    if moe and model.moe is not None:
        mo = model.moe
        e = mo.num_experts
        k = mo.top_k
        # the most-loaded EP rank's routed copies over the balanced mean (--moe-load-imbalance):
        # every routed term below is that rank's (its memory is the peak); the router's fp32
        # logits / probabilities and the shared experts see every token once and do not scale
        ld = routed_load(job, ep_) * one
        block = 2 * 4.0 * e * rep  # router logits + probabilities (fp32): not routed
        # dispatched tokens (expert fc1 input) after the expert-TP all-gather: routed, scales
        block = block + lin * h * k * expert_token_factor(tp_, etp) * ld
        # the MoE SwiGLU input (fc1 output) cached in FP8 (§3.3.3 (2)) or the activation dtype
        moe_fc1 = 1.0 if options.moe_swiglu_fp8_input else ab
        ex, big = mlp_bytes(mo.expert_ffn_hidden_size, fc1_out=moe_fc1)
        block = block + k * ex * ld  # expert hidden states per routed copy: scale
        if options.moe_prob_scaling == "combine":
            # the unpermute scales the expert outputs and keeps them (Megatron-Core < 0.13);
            # the unpermuted outputs are the rank's own tokens' copies back: do not scale
            block = block + ab * h * k * rep
        else:
            # the weighted activation keeps the fp32 probability of each routed copy: scales
            block = block + 4.0 * k * expert_token_factor(tp_, etp) * ld
        clamp_saved = np.zeros(shape)
        if options.moe_glu_clamp_bias:
            # the clamp keeps the unclamped fc1 output (cost/moe_glu_bias.py): routed, scales
            clamp_saved = glu_clamp_bias_bytes(model, ab, tp_, etp, ld).clamp_saved * one
            block = block + clamp_saved
        largest = np.maximum(largest, k * big * ld)  # routed fc1 output workspace: scales
        sh = np.zeros(shape)
        if mo.num_shared_experts:
            sh, big2 = mlp_bytes(mo.num_shared_experts * mo.shared_ffn, fc1_out=moe_fc1)
            block = block + sh
            largest = np.maximum(largest, big2)
        kept = kept + block
        if "moe" in mods:
            dropped["moe"] = block  # the whole block is checkpointed at its input
        else:
            if "moe_act" in mods:
                # the activation output each routed copy's fc2 saved (+ unfused silu output)
                act_out = lin + (0.0 if fused or not swiglu else ab)
                dropped["moe_act"] = k * act_out * mo.expert_ffn_hidden_size / tp_ * ld \
                    + clamp_saved
                if options.moe_swiglu_fp8_input and mo.num_shared_experts \
                        and "shared_experts" not in mods:
                    # the shared expert's SwiGLU output too (§3.3.3 (2): "in MoE"; a
                    # recomputed shared expert block drops it already)
                    dropped["moe_act"] = dropped["moe_act"] + act_out * (
                        mo.num_shared_experts * mo.shared_ffn) / tp_ * one
            if "shared_experts" in mods and mo.num_shared_experts:
                dropped["shared_experts"] = sh
    else:
        mb, big = mlp_bytes(model.ffn_hidden_size,
                            swiglu_unfused(options.unfused_ops, model, moe=False))
        kept = kept + mb
        largest = np.maximum(largest, big)
        if "mlp" in mods:
            dropped["mlp"] = mb  # checkpointed at its input (the norm-2 output, kept)
    kept = kept + drop * h * rep  # MLP-output dropout mask
    if not fused and options.eager_ops == "llama-upcast" and model.norm == "rmsnorm":
        # eager fp32-upcast RMSNorm saves its fp32 input for `pow` (4 B) on top of the two
        # bf16 tensors counted above; fp32 RoPE saves the fp32 complex q, k for the multiply
        kept = kept + 2 * 4.0 * h * rep
        if model.position_embedding == "rope" and model.mla is None:
            kept = kept + 4.0 * (a + model.kv_heads) * dqk / tp_
    del cp_, ep_
    ckpt = res * h * rep  # layer input (sequence-sharded under SP)
    largest = np.maximum(largest, core)
    if "core_attn" in mods:
        dropped["core_attn"] = core
    if "layernorm" in mods:
        dropped["layernorm"] = norm_outs
    if "mla_up_proj" in mods and model.mla is not None:
        dropped["mla_up_proj"] = mla_qkv
    if options.selective_policy != "attention":
        dropped = {"core_attn": core}  # op-level SAC is priced by _op_sac_per_token
    return ActBreakdown(kept=kept, core=core, ckpt=ckpt, largest=largest, dropped=dropped)


def korthikanti_gpt_layer_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                                mode: str = "none") -> float:
    """Korthikanti et al. 2022 Table 2 for a GPT layer, via the op-by-op model above.

    GPT layer = LayerNorm, MHA without flash attention, GELU MLP of width 4h, dropout,
    bf16 activations (Megatron). Returns bytes per layer for sequence `s`, micro-batch `b`.
    `mode="full"` returns the checkpoint (2sbh, /t with SP).
    """
    model = ModelSpec(name="gpt", num_layers=1, hidden_size=h, ffn_hidden_size=4 * h,
                      num_attention_heads=a, vocab_size=8, mlp="gelu", norm="layernorm",
                      position_embedding="learned")
    gpu = GPUSpec(name="x", memory_gib=80, bf16_tflops=312, hbm_gbps=2039)
    link = LinkSpec(bandwidth_gbps=1)
    group = NodeGroup(name="n", gpu=gpu, gpus_per_node=8, num_nodes=1, intra_node=link,
                      inter_node=link)
    cl = ClusterSpec(name="c", node_groups=[group])
    recipe = TrainingRecipe(name="gpt-nonflash", flash_attention=False)
    job = Job(model=model, cluster=cl, recipe=recipe, seq_len=s, global_batch=b)
    br = layer_activation_per_token(job, False, t, 1, 1, 1 if sp else 0, CostOptions(dropout=True))
    tokens = s * b
    if mode == "full":
        return float(br.ckpt) * tokens
    if mode == "selective":
        return float(br.kept) * tokens
    return float(br.kept + br.core) * tokens


def _op_sac_matmuls(job: Job, moe: bool) -> list[tuple[float, float, bool]] | None:
    """Forward matmuls of a dense layer in the order torchtitan's Llama code issues them, as
    (in_features, out_features, column_parallel): wq, wk, wv, wo, then w1 (gate), w3 (up), w2
    (SwiGLU) or fc1, fc2 (GELU). None where the layer has no such fixed sequence (MoE, MLA).

    torchtitan's op-level SAC policy (`parallelize_llama._apply_ac_to_transformer_block`,
    2024-12) counts `aten.mm` calls within a block and saves the output of every odd one
    (1st, 3rd, ...), recomputing the even ones (wk, wo, w3 for Llama) in backward.
    """
    model = job.model
    if moe or model.mla is not None:
        return None
    h = float(model.hidden_size)
    a, dqk, dv = attention_dims(model)
    kv = model.kv_heads
    ffn = float(model.ffn_hidden_size)
    mms: list[tuple[float, float, bool]] = [
        (h, float(a * dqk), True), (h, float(kv * dqk), True), (h, float(kv * dv), True),
        (float(a * dv), h, False)]
    if model.gated_mlp:
        mms += [(h, ffn, True), (h, ffn, True), (ffn, h, False)]
    else:
        mms += [(h, ffn, True), (ffn, h, False)]
    return mms


def _op_sac_per_token(job: Job, moe: bool, tp: FloatArray, sp: FloatArray,
                      br: ActBreakdown) -> FloatArray:
    """torchtitan op-level selective AC: the layer input, the attention output and its fp32
    statistics (SDPA is in the save list) and the outputs of the odd-numbered matmuls
    (`_op_sac_matmuls`); everything else is recomputed. A row-parallel matmul's output is the
    full-sequence partial sum before the reduce-scatter. MoE/MLA layers: half of the matmul
    outputs (no fixed matmul order to count)."""
    model = job.model
    ab = float(job.recipe.activation_bytes)
    h = model.hidden_size
    a, dqk, dv = attention_dims(model)
    base = br.ckpt + ab * a * dv / tp + 4.0 * a / tp
    mms = _op_sac_matmuls(job, moe)
    if mms is not None:
        saved = sum(ab * (o / tp if col else o + 0.0 * tp) for _, o, col in mms[0::2])
        return base + saved
    kvh = a if model.mla is not None else model.kv_heads
    rep = np.where(sp > 0, 1.0 / tp, 1.0)
    if moe and model.moe is not None:
        ffn = model.moe.top_k * model.moe.expert_ffn_hidden_size + (
            model.moe.num_shared_experts * model.moe.shared_ffn)
    else:
        ffn = model.ffn_hidden_size
    up = 2 * ffn if model.gated_mlp else ffn
    mm_out = ab * ((a * dqk + 2 * kvh * dv + up) / tp + 2 * h * rep)
    return base + 0.5 * mm_out


def _op_sac_recompute_s(job: Job, moe: bool, gpu: GPUSpec, tokens: FloatArray, tp: FloatArray,
                        gemm_fwd: FloatArray) -> FloatArray:
    """Forward time of the matmuls op-level SAC replays (the even-numbered ones of
    `_op_sac_matmuls`); half the forward GEMM time where the order is not fixed."""
    mms = _op_sac_matmuls(job, moe)
    if mms is None:
        return 0.5 * gemm_fwd
    dtype = job.recipe.compute_dtype
    t = np.zeros_like(tokens)
    for i, o, col in mms[1::2]:
        k = i if col else i / tp
        n = o / tp if col else o + 0.0 * tp
        t = t + gemm_time(gpu, tokens, k, n, dtype)
    return job_compute_stretch(job) * t
