"""The cost model in factor form (docs/design.md): per-layer and per-stage numbers, vectorized.

API summary for the solver (all functions are pure; array arguments broadcast with numpy; `g`
is a scalar node-group index into `job.cluster.node_groups`; `mode` is 0 none / 1 selective /
2 full or the string):

- ``layer_factors(job, g, tp, cp, ep, sp, mbs, mode, moe=False, options=None) -> LayerFactors``
  per layer, per micro-batch: ``act_bytes`` (kept per in-flight micro-batch), ``ckpt_bytes``
  (kept when the layer is fully recomputed), ``work_bytes`` (transient while this layer runs its
  backward), ``time_s`` (fwd + bwd incl. exposed TP/CP/EP comm), ``recompute_s`` (extra time when
  fully recomputed), and the parts ``compute_s``, ``tp_s``, ``cp_s``, ``ep_s``.
  Use ``mode=2`` rows for the recomputed layers (``ckpt_bytes`` / ``recompute_s``) and the
  plan's base mode (0 or 1) for the others (``act_bytes``): a plan with ``recompute=full`` and
  ``recompute_layers=r`` has ``l - r`` layers in mode 0 (none).
- ``layer_param_counts(job, moe, tp, ep) -> (dense, expert)`` parameters per GPU of one layer.
- ``state_bytes_per_param(recipe, zero, shard) -> (weights, grads, optimizer)`` bytes per
  parameter held on a GPU whose ZeRO shard group has ``shard`` members
  (dense params: ``shard = dp*cp``; expert params: ``shard = dp*cp/ep``).
- ``edge_factors(job, g, tp, cp, sp, mbs, options) -> EdgeFactors`` first stage (embedding:
  ``emb_*``) and last stage (final norm + LM head + loss: ``head_*``): params per GPU, bytes per
  in-flight micro-batch (first stage), transient bytes (last stage), time per micro-batch.
- ``buffer_bytes_per_param(job, zero)`` transient copies per parameter on the GPU
  (pytorch-amp autocast weight copies); ``zero3_buffer_bytes(job, tp, ep, zero)``.
- ``p2p_factor(job, g, tp, cp, sp, mbs, pp, vpp, dp)`` per micro-batch pipeline send/recv time.
- ``dp_sync_factors(job, g, tp, cp, dp, ep, zero)`` -> (s per dense param on the GPU,
  s per expert param, zero3 all-gather s per dense param per micro-batch, fixed latency s).
- ``optimizer_factor(job, g)`` -> s per parameter shard element updated.
- ``inflight(pp, vpp, m, stage)`` in-flight micro-batches of a stage (1F1B / interleaved).
- ``OTHER_BYTES``, ``overhead_bytes(peak)``: constant allowances.

The composition (docs/design.md) is implemented once in memory.py / steptime.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from . import comm
from .efficiency import flash_attention_time, gemm_time, hbm_time
from .flops import attention_core_flops, attention_dims, head_gemm, layer_gemms
from .params import count_params, layer_breakdown
from .specs import GIB, FrameworkBehaviour, GPUSpec, Job, NodeGroup, TrainingRecipe

FloatArray = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike

MODE_CODES = {"none": 0, "selective": 1, "full": 2}

# ---------------------------------------------------------------------------------------------
# Named constants (each justified)
# ---------------------------------------------------------------------------------------------

#: CUDA context + cuBLAS workspaces + NCCL communicator buffers, outside the caching allocator
#: (typical `nvidia-smi` minus `memory_reserved` on H100 with NCCL initialised: 0.7-1.2 GiB).
CUDA_CONTEXT_BYTES = 1.0 * GIB
#: Caching-allocator fragmentation: reserved / allocated at the peak (H200 rows: 1.02-1.09 for
#: a fresh shape; torch docs recommend headroom). Applied to the allocated peak.
ALLOCATOR_FRAGMENTATION = 0.05
#: Layers whose full (unsharded) bf16 parameters are resident at once under ZeRO-3 / FSDP:
#: the layer being computed and the prefetched next one (FSDP `forward_prefetch` / FSDP2).
ZERO3_RESIDENT_LAYERS = 2
#: Gradient-reduction buckets not aliased to the gradient buffer (PyTorch DDP default
#: `bucket_cap_mb=25`, two in flight); Megatron's buckets are views of its grad buffer (0).
DDP_BUCKET_BYTES = 2 * 25 * 2**20
#: Share of the DP gradient reduction that runs after backward even when overlapped: the last
#: bucket starts after the last layer's backward (Megatron default bucket 40M params).
DP_LAST_BUCKET_FRACTION = 0.1
#: Share of the GPU's SMs a collective's kernel occupies while it overlaps compute (one CTA per
#: NCCL channel): an H100 `ncclAllGather` overlapped with a GEMM runs 24 CTAs on 132 SMs and
#: the GEMM slows accordingly (NVIDIA developer forum, "Compute-communication overlap causes
#: severe GEMM performance degradation because of tail effect", nsys trace; DeepSeek-V3 report
#: §3.2.2 likewise reserves 20 of 132 SMs for communication). See `overlap_exposed`.
COMM_SM_SHARE = 24.0 / 132.0
#: Least exposed share of an overlapped DP gradient synchronisation: the last bucket runs after
#: backward, the rest slows the backward it overlaps by COMM_SM_SHARE of its duration
#: (`overlap_exposed` on the overlapped part): exposed = max(DP_TAIL_FRACTION·d, d - window).
DP_TAIL_FRACTION = DP_LAST_BUCKET_FRACTION + COMM_SM_SHARE * (1.0 - DP_LAST_BUCKET_FRACTION)
#: Bytes of HBM traffic per parameter of one Adam step (fp32 master r/w 8, m r/w 8, v r/w 8,
#: fp32 grad read 4, bf16 weight write 2): memory-bound (Megatron fused Adam / torch fused AdamW).
ADAM_BYTES_PER_PARAM = 30.0
#: HBM traffic per parameter of torch's multi-tensor (foreach) AdamW over fp32 params
#: (torch/optim/adam.py `_multi_tensor_adam`, decoupled weight decay): param *= (1 - lr·wd)
#: r4 w4; lerp m toward g r8 w4; v *= b2 r4 w4; v += (1-b2)·g² r8 w4; sqrt(v) r4 w4; / bias
#: correction r4 w4; + eps r4 w4; param addcdiv r12 w4 = 80 (vs 28 fused).
ADAM_FOREACH_BYTES_PER_PARAM = 80.0
#: HBM traffic per parameter of global gradient-norm clipping on fp32 gradients: the norm pass
#: reads 4, the scaling pass reads and writes 8 (Megatron `clip_grad_norm_fp32`: multi-tensor
#: l2norm + scale; torch `clip_grad_norm_`: foreach norm + foreach mul).
GRAD_CLIP_BYTES_PER_PARAM = 12.0
#: HBM traffic per (tp-local) parameter of one ZeRO-3 layer per micro-batch in PyTorch FSDP2
#: (torch/distributed/_composable/fsdp/_fsdp_collectives.py): the all-gather output is copied
#: out into the unsharded parameters in forward and again in backward (`split_with_sizes_copy`,
#: r2 w2 each), and the bf16 unsharded gradients are packed into the reduce-scatter input in
#: the reduce dtype (`_chunk_cat`, r2 w grad_reduce_bytes). The shard-sized copy-in is /dp and
#: ignored. Megatron's buffers are views of the communication buffers (no copies).
FSDP_COPY_OUT_BYTES_PER_PARAM = 8.0
#: Bytes per logits element held at the loss peak (per token per vocab entry):
#: Megatron vocab-parallel CE keeps bf16 logits 2 + fp32 copy 4 (softmax computed in place,
#: backward turns it into the gradient in place, then casts it to bf16: 4 + 2).
#: PyTorch `cross_entropy(logits.float())`: the forward holds bf16 logits 2 + fp32 copy 4 +
#: log-softmax output 4 = 10, but the backward is higher: `nll_loss_backward` materialises a
#: dense fp32 gradient (4) and `_log_softmax_backward_data` writes another (4) while the saved
#: log-softmax output (4) is still alive = 12 (the bf16 logits are gone by then when the
#: caller drops them, as torchtitan's `del pred` does). Autocast weight copies (pytorch-amp)
#: are freed at that moment but stay counted in the buffers: pytorch-amp peaks come out up
#: to 2 B/param high (+1..5% on the H200 rows), on the safe side.
LOGITS_BYTES = {"megatron": 6.0, "pytorch": 12.0}
#: PyTorch with tensor parallelism computes the loss on vocab-sharded DTensor logits (loss
#: parallelism, torchtitan's default with TP): `torch.distributed.tensor.parallel.loss.
#: _log_softmax` keeps the fp32 input, `shifted = x - max` and `exp(shifted)` (or the result)
#: alive at once, beside the bf16 logits: 2 + 4 + 4 + 4 = 14 B per logit in forward.
LOSS_PARALLEL_LOGITS_BYTES = 14.0
#: HBM bytes moved per logits element by the (unfused) cross entropy, forward + backward, after
#: the head GEMM wrote the bf16 logits. Megatron `_VocabParallelCrossEntropy`
#: (megatron/core/tensor_parallel/cross_entropy.py): `.float()` r2 w4, max r4, in-place
#: subtract r4 w4, in-place exp r4 w4, sum r4, in-place div (softmax) r4 w4 = 38 forward;
#: backward `grad_input.mul_(grad_output)` r4 w4, cast back to bf16 r4 w2 = 14; total 52.
#: PyTorch `F.cross_entropy(logits.float(), labels)`: cast r2 w4, log_softmax (max pass r4,
#: sum-exp pass r4, write pass r4 w4) = 22 forward; backward: nll_loss grad zero-fill w4,
#: log_softmax backward (sum pass r4, r4 r4 w4), cast back r4 w2 = 26; total 48.
CE_BYTES_PER_LOGIT = {"megatron": 52.0, "pytorch": 48.0}
#: HBM passes (read+write) of one elementwise op per byte of its input in backward relative to
#: forward (grad in + saved input read, grad out write): backward traffic = 2x forward.
ELEMENTWISE_BWD_FACTOR = 2.0
#: Extra HBM traffic of unfused eager PyTorch elementwise ops (separate cast, scale, mul kernels)
#: relative to fused Megatron/compiled kernels; calibrated on the H200 eager rows.
EAGER_ELEMENTWISE_FACTOR = 2.0
#: Eager HBM bytes per element of the Llama modules as torchtitan (2024) and HF transformers
#: write them (`CostOptions.eager_ops="llama-upcast"`), one kernel per op on bf16 inputs:
#: RMSNorm `(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w`: cast r2 w4,
#: pow r4 w4, mean r4, mul r4 w4, cast back r4 w2, weight mul r2 w2 = 36 (fused: 4).
EAGER_LLAMA_NORM_BYTES = 36.0
#: RoPE through fp32 (torchtitan: `view_as_complex(x.float())` times `freqs_cis`, then
#: `type_as`): cast r2 w4, complex multiply r4 w4, cast back r4 w2 = 20 per q/k element
#: (fused: 4).
EAGER_LLAMA_ROPE_BYTES = 20.0
#: `silu(w1(x)) * w3(x)`: silu r2 w2, mul r4 w2 = 10 per ffn element (fused: 6).
EAGER_LLAMA_SWIGLU_BYTES = 10.0
#: Host (Python + dispatcher + launch) time of one eager PyTorch layer's forward + backward
#: (~25 forward ops and ~50 autograd nodes at ~30 us each); an unfused, uncompiled layer cannot
#: run faster than its host issues kernels. Fitted on the H200 tiny1b s=2048 b=1 row
#: ((48.1 ms - optimizer - head) / 16 layers).
EAGER_HOST_S_PER_LAYER = 2.5e-3
#: Extra host time of a `torch.utils.checkpoint` layer (replayed forward + saved-tensor hooks);
#: fitted on the H200 tiny1b s=2048 b=1 recompute row ((81.6 - 48.1) ms / 16 layers).
EAGER_HOST_S_RECOMPUTE = 2.1e-3


#: Framework behaviours that are not plan axes; one per recipe (`TrainingRecipe.behaviour`),
#: overridable per call (`evaluate(job, plan, options)`). Field meanings: `FrameworkBehaviour`.
CostOptions = FrameworkBehaviour


def recipe_options(recipe: TrainingRecipe) -> CostOptions:
    """The cost options a recipe's `behaviour` describes."""
    return recipe.behaviour


def options_for(job: Job, options: CostOptions | None) -> CostOptions:
    """`options` when given (an explicit override), else the job's recipe behaviour."""
    return options if options is not None else recipe_options(job.recipe)


def _f(x: ArrayLike) -> FloatArray:
    return np.asarray(x, dtype=np.float64)


def _mode(mode: ArrayLike | str) -> FloatArray:
    if isinstance(mode, str):
        return np.asarray(float(MODE_CODES[mode]))
    m = np.asarray(mode)
    if m.dtype.kind in "US":
        return np.vectorize(lambda x: float(MODE_CODES[str(x)]))(m).astype(np.float64)
    return m.astype(np.float64)


def _is_pytorch(recipe: TrainingRecipe) -> bool:
    return recipe.framework == "pytorch"


def _fp32_residual(recipe: TrainingRecipe) -> bool:
    """PyTorch autocast over fp32 weights: the fp32 embedding output keeps the residual stream
    (and every norm input) in fp32. FSDP mixed precision (bf16 params, no autocast copies) and
    Megatron keep it in the activation dtype."""
    return _is_pytorch(recipe) and recipe.transient_weight_copy_bytes > 0


def _fused(recipe: TrainingRecipe, options: CostOptions) -> bool:
    return (not _is_pytorch(recipe)) if options.fused is None else options.fused


def node(job: Job, g: int) -> NodeGroup:
    return job.cluster.node_groups[int(g)]


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


def layer_activation_per_token(
    job: Job, moe: bool, tp: ArrayLike, cp: ArrayLike, ep: ArrayLike, sp: ArrayLike,
    options: CostOptions | None = None,
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
      fc1 input), expert hidden states per routed copy, expert outputs for the weighted combine;
    - MLA: compressed q / kv latents and their norms (replicated), then Q, K, V per head.
    PyTorch autocast keeps the residual stream and norm inputs in fp32 (4 B) since the
    embedding output is fp32; Megatron keeps them in bf16.
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

    kept = np.zeros(shape)
    core = np.zeros(shape)
    largest = np.zeros(shape)
    # --- attention block ---
    kept = kept + (res * h + ab * h) * rep  # norm-1 input, QKV-projection input
    if model.mla is not None:
        m = model.mla
        lat = m.kv_lora_rank + (m.q_lora_rank or 0)
        kept = kept + 2 * ab * lat * one  # latent norm inputs + up-projection inputs (replicated)
        q_bytes = ab * a * dqk / tp_
        k_bytes = ab * a * dqk / tp_
        v_bytes = ab * a * dv / tp_
    else:
        kv = a if (options.gqa_repeat_kv and recipe.flash_attention) else model.kv_heads
        q_bytes = ab * a * dqk / tp_
        k_bytes = ab * kv * dqk / tp_
        v_bytes = ab * kv * dv / tp_
        if model.qk_norm:
            kept = kept + q_bytes + k_bytes  # pre-norm q, k
    out_bytes = ab * a * dv / tp_
    if recipe.flash_attention:
        # q, k, v, output (= out-proj input in sbhd layout), fp32 logsumexp per head
        kept = kept + q_bytes + k_bytes + v_bytes + out_bytes + 4.0 * a / tp_
        if _is_pytorch(recipe):
            kept = kept + out_bytes  # transpose(1,2).reshape copy fed to the out projection
    else:
        kept = kept + q_bytes + k_bytes + v_bytes + out_bytes
        core = core + (ab + drop * (1.0 + ab)) * a * s_kv / tp_ * one
    kept = kept + drop * h * rep  # attention-output dropout mask
    # --- MLP block ---
    kept = kept + (res * h + ab * h) * rep  # norm-2 input, MLP / router input
    swiglu = model.mlp == "swiglu"

    def mlp_bytes(ffn: float) -> tuple[FloatArray, FloatArray]:
        if swiglu:
            per = (2 * ab + ab + (0.0 if fused else ab)) * ffn
            big = 2 * ab * ffn
        else:
            per = 2 * ab * ffn
            big = ab * ffn
        return per / tp_ * one, big / tp_ * one

    if moe and model.moe is not None:
        mo = model.moe
        e = mo.num_experts
        k = mo.top_k
        kept = kept + 2 * 4.0 * e * rep  # router logits + probabilities (fp32)
        kept = kept + ab * h * k * one  # dispatched tokens (expert fc1 input), gathered over tp
        ex, big = mlp_bytes(mo.expert_ffn_hidden_size)
        kept = kept + k * ex
        kept = kept + ab * h * k * rep  # expert outputs kept for the weighted combine
        largest = np.maximum(largest, k * big)
        if mo.num_shared_experts:
            sh, big2 = mlp_bytes(mo.num_shared_experts * mo.shared_ffn)
            kept = kept + sh
            largest = np.maximum(largest, big2)
    else:
        mb, big = mlp_bytes(model.ffn_hidden_size)
        kept = kept + mb
        largest = np.maximum(largest, big)
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
    return ActBreakdown(kept=kept, core=core, ckpt=ckpt, largest=largest)


def korthikanti_gpt_layer_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                                mode: str = "none") -> float:
    """Korthikanti et al. 2022 Table 2 for a GPT layer, via the op-by-op model above.

    GPT layer = LayerNorm, MHA without flash attention, GELU MLP of width 4h, dropout,
    bf16 activations (Megatron). Returns bytes per layer for sequence `s`, micro-batch `b`.
    `mode="full"` returns the checkpoint (2sbh, /t with SP).
    """
    from .specs import ClusterSpec, LinkSpec, ModelSpec
    from .specs import NodeGroup as _NG

    model = ModelSpec(name="gpt", num_layers=1, hidden_size=h, ffn_hidden_size=4 * h,
                      num_attention_heads=a, vocab_size=8, mlp="gelu", norm="layernorm",
                      position_embedding="learned")
    gpu = GPUSpec(name="x", memory_gib=80, bf16_tflops=312, hbm_gbps=2039)
    link = LinkSpec(bandwidth_gbps=1)
    cl = ClusterSpec(name="c", node_groups=[_NG(name="n", gpu=gpu, gpus_per_node=8, num_nodes=1,
                                                 intra_node=link, inter_node=link)])
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
    if model.mlp == "swiglu":
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
    up = 2 * ffn if model.mlp == "swiglu" else ffn
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
    return t


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


def _elementwise_bytes_fwd(job: Job, moe: bool, tp: FloatArray, sp: FloatArray,
                           options: CostOptions) -> FloatArray:
    """Forward HBM traffic per token of a layer's memory-bound ops (norms, adds, activation).

    Norm: read input, write output; residual add: read two, write one; SwiGLU read 2·ffn,
    write ffn (GELU: read, write ffn); rotary embedding on q, k (read + write). PyTorch
    models also copy the bshd attention output to a contiguous tensor and, with
    `gqa_repeat_kv`, expand K, V to every query head; these plain copies are one kernel each,
    fused or not.
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
        # permute + unpermute copies of the routed tokens
        adds = adds + 4 * ab * h * model.moe.top_k
    else:
        ffn = model.ffn_hidden_size
    act = (3 if model.mlp == "swiglu" else 2) * ab * ffn / tp
    rope = 2 * ab * (a + kvh) * dqk / tp if model.position_embedding == "rope" else 0.0 * tp
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


def overlap_exposed(comm: ArrayLike, compute: ArrayLike) -> FloatArray:
    """Time a collective of duration `comm` adds to the `compute` it runs alongside.

    The compute advances at (1 - COMM_SM_SHARE) while the collective holds its SMs: if the
    collective outlasts the slowed compute, the rest of it is exposed (comm - compute), else the
    compute is stretched by COMM_SM_SHARE·comm; the larger of the two is exact for this model.
    """
    c = _f(comm)
    return np.maximum(c - _f(compute), COMM_SM_SHARE * c)


def layer_factors(
    job: Job, g: int, tp: ArrayLike, cp: ArrayLike, ep: ArrayLike, sp: ArrayLike,
    mbs: ArrayLike, mode: ArrayLike | str, moe: bool = False,
    options: CostOptions | None = None,
) -> LayerFactors:
    """Per layer, per micro-batch factors on node group `g` (docs/design.md factor form).

    Time = GEMMs (forward, dgrad, wgrad, each at its shape's efficiency; efficiency.py)
    + attention core (flash curve, or two batched GEMMs + softmax traffic without flash)
    + memory-bound elementwise ops at HBM bandwidth + exposed communication:
    TP: 2 all-reduces forward + 2 backward of b·s·h (Narayanan §3.2), or with SP 2 all-gathers
    + 2 reduce-scatters each way (Korthikanti §4.2.2, same volume); CP: ring exchange of the
    K,V chunks, (cp-1) steps forward and 2x in backward (K,V and dK,dV), overlapped with the
    attention of the chunk in flight (Megatron CP doc); EP: all-to-all dispatch + combine forward
    and backward of top_k·tokens·h (llm-analysis, nccl-tests (n-1)/n).
    Full recompute replays the forward (and its TP/CP/EP comm); selective recompute replays the
    attention core (Korthikanti §5).
    """
    opts = options_for(job, options)
    model = job.model
    recipe = job.recipe
    nd = node(job, g)
    gpu = nd.gpu
    tp_, cp_, ep_, sp_, mbs_ = (_f(x) for x in (tp, cp, ep, sp, mbs))
    md = _mode(mode)
    tp_, cp_, ep_, sp_, mbs_, md = np.broadcast_arrays(tp_, cp_, ep_, sp_, mbs_, md)
    if not moe:
        ep_ = np.ones_like(ep_)
    s = float(job.seq_len)
    tokens = mbs_ * s / cp_
    dtype = recipe.compute_dtype

    # ---- activations ----
    br = layer_activation_per_token(job, moe, tp_, cp_, ep_, sp_, opts)
    act_none = (br.kept + br.core) * tokens
    act_sel = br.kept * tokens
    if opts.selective_policy == "op":
        act_sel = _op_sac_per_token(job, moe, tp_, sp_, br) * tokens
    ckpt = br.ckpt * tokens
    act = np.select([md == 0, md == 1], [act_none, act_sel], ckpt)
    grad_ws = 2.0 * br.largest * tokens
    work = np.where(md == 2, act_none + grad_ws, np.where(md == 1, br.core * tokens, 0.0) + grad_ws)
    ckpt_bytes = ckpt

    # ---- compute ----
    gemm_f = np.zeros_like(tokens)
    gemm_b = np.zeros_like(tokens)
    for gm in layer_gemms(model, moe, tokens, tp_, ep_):
        f = gm.count * gemm_time(gpu, gm.m, gm.k, gm.n, dtype)
        dg = gm.count * gemm_time(gpu, gm.m, gm.n, gm.k, dtype)
        wg = gm.count * gemm_time(gpu, gm.k, gm.m, gm.n, dtype)
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
    ew_f = hbm_time(gpu, _elementwise_bytes_fwd(job, moe, tp_, sp_, opts) * tokens)
    ew_b = ELEMENTWISE_BWD_FACTOR * ew_f
    fwd_compute = gemm_f + att_f + ew_f
    compute = fwd_compute + gemm_b + att_b + ew_b
    if opts.selective_policy == "op":
        # op-level SAC replays every other forward matmul and all elementwise ops
        sac = _op_sac_recompute_s(job, moe, gpu, tokens, tp_, gemm_f)
        compute = compute + np.where(md == 1, sac + ew_f, 0.0)
    else:
        compute = compute + np.where(md == 1, att_f, 0.0)  # attention core replayed
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
    step = comm.p2p(nd, intra_cp, kv_chunk)
    att_step_f = att_f / np.maximum(cp_, 1)
    att_step_b = att_b / np.maximum(cp_, 1)
    if opts.cp_ring == "torch-allgather":
        # torch ring attention with torchtitan's default rotate method "allgather": the K, V
        # of all cp ranks are gathered at the first step and waited for at the second (one
        # step of compute to hide cp-1 transfers), in forward and again in backward; dK, dV
        # accumulate in fp32 (`_cp_options.convert_to_f32`) and travel every step (all-to-all
        # shift, twice the bf16 K, V bytes), the last one after the loop
        gather = (cp_ - 1) * step
        cp_f = np.where(cp_ > 1, overlap_exposed(gather, att_step_f), 0.0)
        cp_b = np.where(cp_ > 1, overlap_exposed(gather, att_step_b)
                        + (cp_ - 1) * overlap_exposed(2 * step, att_step_b) + 2 * step, 0.0)
    else:
        cp_f = np.where(cp_ > 1, (cp_ - 1) * overlap_exposed(step, att_step_f) + step, 0.0)
        cp_b = np.where(cp_ > 1, (cp_ - 1) * overlap_exposed(2 * step, att_step_b)
                        + 2 * step, 0.0)
    cp_total = cp_f + cp_b

    # ---- EP communication ----
    if moe and model.moe is not None:
        a2a_bytes = tokens * model.moe.top_k * model.hidden_size * act_b
        a2a = comm.all_to_all(nd, ep_, tp_, a2a_bytes)
        ep_f = 2 * a2a
    else:
        ep_f = np.zeros_like(tokens)
    ep_total = 2 * ep_f

    time = compute + tp_total + cp_total + ep_total
    recompute = rc_compute + tp_fwd + cp_f + ep_f
    return LayerFactors(
        act_bytes=act, ckpt_bytes=ckpt_bytes, work_bytes=work, time_s=time,
        recompute_s=recompute, compute_s=compute, tp_s=tp_total, cp_s=cp_total, ep_s=ep_total,
        rc_compute_s=rc_compute, rc_tp_s=tp_fwd, rc_cp_s=cp_f, rc_ep_s=ep_f,
    )


# ---------------------------------------------------------------------------------------------
# Parameters and model states
# ---------------------------------------------------------------------------------------------


def layer_param_counts(job: Job, moe: bool, tp: ArrayLike, ep: ArrayLike
                       ) -> tuple[FloatArray, FloatArray]:
    """(dense, expert) parameters of one layer held by one GPU.

    Megatron `theoretical_memory_usage.py`: matrices split over tp, norms replicated, routed
    experts split over ep (and expert-tp = tp).
    """
    model = job.model
    idx = next((i for i in range(model.num_layers) if model.is_moe_layer(i) == moe), 0)
    lp = layer_breakdown(model, idx)
    tp_ = _f(tp)
    ep_ = _f(ep)
    dense = (lp.dense - lp.norms) / tp_ + lp.norms
    expert = lp.expert / (tp_ * ep_)
    return dense + 0.0 * ep_, expert + 0.0 * tp_


def state_bytes_per_param(recipe: TrainingRecipe, zero: ArrayLike, shard: ArrayLike
                          ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(weights, grads, optimizer) bytes per parameter with ZeRO stage `zero` over `shard` GPUs.

    ZeRO §5 (Rajbhandari et al. 2019): stage 1 shards optimizer states (master weights + Adam
    moments), stage 2 also gradients, stage 3 also weights. With megatron-bf16 (2 + 4 + 12):
    18 unsharded, 6 + 12/d distributed optimizer (Megatron dist_optimizer.md); with the ZeRO
    paper's fp16 mixed precision (2 + 2 + 12): 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N.
    """
    z = _f(zero)
    d = np.maximum(_f(shard), 1.0)
    w = recipe.weight_bytes / np.where(z >= 3, d, 1.0)
    gr = recipe.grad_bytes / np.where(z >= 2, d, 1.0)
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


def zero3_buffer_bytes(job: Job, tp: ArrayLike, ep: ArrayLike, zero: ArrayLike) -> FloatArray:
    """ZeRO-3 / FSDP gathered parameters: `ZERO3_RESIDENT_LAYERS` full layers in bf16 (+ the
    gradient of one layer before its reduce-scatter, fp32 for pytorch recipes)."""
    dense, expert = layer_param_counts(job, job.model.moe is not None, tp, ep)
    z = _f(zero)
    per = dense + expert
    gathered = ZERO3_RESIDENT_LAYERS * per * 2.0 + per * job.recipe.grad_bytes
    return np.where(z >= 3, gathered, 0.0)


# ---------------------------------------------------------------------------------------------
# First / last stage
# ---------------------------------------------------------------------------------------------


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
    if _is_pytorch(recipe):
        lb = np.where(tp_ > 1, LOSS_PARALLEL_LOGITS_BYTES, LOGITS_BYTES["pytorch"])
    else:
        lb = LOGITS_BYTES["megatron"] + 0.0 * tp_
    head_work = tokens * v / tp_ * lb
    hg = head_gemm(model, tokens, tp_)
    dtype = recipe.compute_dtype
    head_compute = (gemm_time(gpu, hg.m, hg.k, hg.n, dtype)
                    + gemm_time(gpu, hg.m, hg.n, hg.k, dtype)
                    + gemm_time(gpu, hg.k, hg.m, hg.n, dtype))
    # fp32 logits: cast, max/exp/sum, softmax, grad, cast back (CE_BYTES_PER_LOGIT)
    ce_bytes = tokens * v / tp_ * CE_BYTES_PER_LOGIT["pytorch" if _is_pytorch(recipe)
                                                     else "megatron"]
    head_compute = head_compute + hbm_time(gpu, ce_bytes)
    # vocab-parallel CE all-reduces 3 scalars per token over tp (max, sum-exp, target logit)
    ce_comm = comm.all_reduce(nd, tp_, 1, tokens * 4.0 * 3)
    head_time = head_compute + ce_comm
    return EdgeFactors(
        emb_params=emb_params + 0.0 * tokens, emb_act_bytes=emb_act, emb_time_s=emb_time,
        head_params=head_params + 0.0 * tokens, head_act_bytes=head_act,
        head_work_bytes=head_work, head_time_s=head_time, head_compute_s=head_compute,
    )


# ---------------------------------------------------------------------------------------------
# Pipeline, data-parallel, optimizer
# ---------------------------------------------------------------------------------------------


def p2p_factor(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, sp: ArrayLike, mbs: ArrayLike,
               pp: ArrayLike, vpp: ArrayLike, dp: ArrayLike) -> FloatArray:
    """Pipeline send/recv time per micro-batch on one stage (forward activation + backward grad).

    Narayanan §3.2/§4.1: b·s·h per micro-batch per direction, split over the tp ranks
    (scatter/gather optimisation: /tp); interleaving multiplies the sends by vpp (§2.2).
    The stages are `tp·cp·dp` ranks apart: on NVLink only if that span fits in one node.
    """
    nd = node(job, g)
    tp_, cp_, sp_, mbs_, pp_, vpp_, dp_ = (_f(x) for x in (tp, cp, sp, mbs, pp, vpp, dp))
    tokens = mbs_ * job.seq_len / cp_
    nbytes = tokens * job.model.hidden_size * job.recipe.activation_bytes / tp_
    intra = 1.0 - comm.crosses_nodes(tp_ * cp_ * dp_, nd.gpus_per_node)
    one = comm.p2p(nd, intra, nbytes)
    return np.where(pp_ > 1, 2.0 * one * vpp_, 0.0)


def dp_sync_factors(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, dp: ArrayLike,
                    ep: ArrayLike, zero: ArrayLike
                    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Alpha-beta coefficients of DP gradient synchronisation for the parameters on a GPU.

    Returns (s per dense parameter, s per expert parameter, ZeRO-3 all-gather s per dense
    parameter per micro-batch, fixed latency s of one synchronisation); the time of a stage
    is ``fixed + per_dense·dense + per_expert·expert``. Dense gradients reduce over the dp·cp
    group (Megatron `data_parallel_group_with_cp`), expert gradients over dp·cp/ep; no ZeRO:
    all-reduce (2(n-1)/n, hierarchical across nodes); ZeRO-1/2: reduce-scatter of gradients +
    all-gather of updated weights (same volume, ZeRO §7); ZeRO-3: reduce-scatter, plus an
    all-gather of the weights in forward and in backward per micro-batch (1.5x, ZeRO §7.2.2),
    overlapped per layer. Gradients travel in `recipe.grad_reduce_bytes` (fp32 by default: FSDP
    reduce_dtype, and Megatron bf16 training forces fp32 all-reduce, arguments.py).
    """
    nd = node(job, g)
    tp_, cp_, dp_, ep_, z = (_f(x) for x in (tp, cp, dp, ep, zero))
    gb = float(job.recipe.grad_reduce_bytes)
    wb = 2.0  # weights gathered in bf16
    n_dense = dp_ * cp_
    n_exp = np.maximum(dp_ * cp_ / ep_, 1.0)
    ref = 1e9  # reference message (bytes) to separate the bandwidth term from the latency

    def sync(n: FloatArray, st: FloatArray, nbytes: float) -> FloatArray:
        ar = comm.all_reduce(nd, n, st, nbytes * gb)
        rs = comm.reduce_scatter(nd, n, st, nbytes * gb) + comm.all_gather(nd, n, st,
                                                                           nbytes * wb)
        rs3 = comm.reduce_scatter(nd, n, st, nbytes * gb)
        return np.where(z == 0, ar, np.where(z >= 3, rs3, rs))

    fixed = sync(n_dense, tp_, 0.0)
    per_dense = (sync(n_dense, tp_, ref) - fixed) / ref
    per_exp = (sync(n_exp, tp_ * ep_, ref) - sync(n_exp, tp_ * ep_, 0.0)) / ref
    ag0 = comm.all_gather(nd, n_dense, tp_, 0.0)
    z3 = np.where(z >= 3, 2.0 * (comm.all_gather(nd, n_dense, tp_, ref * wb) - ag0) / ref, 0.0)
    return per_dense, per_exp, z3, fixed


def optimizer_factor(job: Job, g: int) -> float:
    """Seconds per locally updated parameter of one fused Adam step (HBM-bound)."""
    gpu = node(job, g).gpu
    recipe = job.recipe
    if recipe.optimizer_kernel == "foreach":
        # + the bf16 working copy (r4 w2) when the optimizer updates an fp32 master
        per = ADAM_FOREACH_BYTES_PER_PARAM + (6.0 if recipe.master_weight_bytes > 0 else 0.0)
    else:
        per = ADAM_BYTES_PER_PARAM - (2.0 if recipe.master_weight_bytes == 0 else 0.0)
    if recipe.grad_clip:
        per += GRAD_CLIP_BYTES_PER_PARAM
    return float(hbm_time(gpu, per))


def zero3_copy_factor(job: Job, g: int) -> float:
    """Seconds per tp-local dense parameter per micro-batch of ZeRO-3's memory-bound packing
    (`FSDP_COPY_OUT_BYTES_PER_PARAM` + the reduce-dtype pack); 0 for Megatron."""
    if not _is_pytorch(job.recipe):
        return 0.0
    per = FSDP_COPY_OUT_BYTES_PER_PARAM + 2.0 + float(job.recipe.grad_reduce_bytes)
    return float(hbm_time(node(job, g).gpu, per))


def inflight(pp: ArrayLike, vpp: ArrayLike, m: ArrayLike, stage: ArrayLike) -> FloatArray:
    """Micro-batches whose activations stage `stage` holds at its peak, in full-stage units.

    1F1B: min(pp - stage, m) (Korthikanti §4.2.3, Galvatron). Interleaved (Megatron
    `forward_backward_pipelining_with_interleaving` warm-up): (pp - stage - 1)·2 + (vpp - 1)·pp
    + 1 model chunks, capped at m·vpp, in units of one chunk = 1/vpp of the stage; on the first
    stage this is pp·(1 + (pp-1)/(pp·vpp)) (Korthikanti §4.2.3).
    """
    pp_, vpp_, m_, j = (_f(x) for x in (pp, vpp, m, stage))
    one_f = np.minimum(pp_ - j, m_)
    chunks = np.minimum((pp_ - j - 1) * 2 + (vpp_ - 1) * pp_ + 1, m_ * vpp_)
    return np.where(vpp_ > 1, chunks / vpp_, one_f)


#: Constant allocated bytes outside params/activations (comm buckets) by framework.
OTHER_BYTES = {"megatron": 0.0, "pytorch": float(DDP_BUCKET_BYTES)}


def other_bytes(job: Job) -> float:
    """Allocated bytes not in the breakdown's other fields (PyTorch DDP buckets)."""
    return OTHER_BYTES["pytorch" if _is_pytorch(job.recipe) else "megatron"]


def overhead_bytes(peak: ArrayLike) -> FloatArray:
    """Memory the GPU needs beyond the allocated peak: CUDA context + allocator fragmentation."""
    return CUDA_CONTEXT_BYTES + ALLOCATOR_FRAGMENTATION * _f(peak)
