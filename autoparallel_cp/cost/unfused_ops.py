"""HBM traffic of the elementwise ops a Megatron layer runs as its plain PyTorch ops instead of
a fused kernel (recipe behaviour `unfused_ops`), op by op, forward and backward.

Megatron's legacy ("local", non-Transformer-Engine) layer fuses some elementwise ops and runs
others as PyTorch ops, one kernel each; which ones depends on the fork and its flags. The
counts below are bytes read plus written per element, in units of the activation dtype's
bytes `ab`, from the framework source at the cited commits and PyTorch's autograd formulas
(each op reads its inputs once and writes its output once; a view costs nothing):

"rope": `apply_rotary_pos_emb` of megatron/core/models/common/embeddings/
rotary_pos_embedding.py (FlagOpen/FlagScale @26cd664, the legacy layer's
megatron/model/transformer.py l. 868-869 calls it on q and k), rot_dim = head dim, `t_pass`
empty. Forward per q/k element: `t * cos_` r1 w1 = 2; `_rotate_half`: `-x2` on the half r.5
w.5 = 1, `torch.cat((-x2, x1))` r1 w1 = 2; `* sin_` 2; the add r2 w1 = 3; the final
`torch.cat((t, t_pass))` (a copy even with t_pass empty) 2: 12. Backward: the two muls' input
gradients (cos_, sin_ need none) 2 + 2; neg 1; the chunk's backward concatenates the two
halves' gradients 2; the two gradients of the sliced t accumulate r2 w1 = 3; the
`t[..., :rot_dim]` slice's backward fills a zeros tensor and copies into it w1 + r1 w1 = 3;
the empty `t[..., rot_dim:]` slice still gets a (size-0) gradient from the cat's backward, so
its slice backward writes a full zeros tensor 1, accumulated with the other r2 w1 = 3: 17.
Per sequence position each call also takes `cos` and `sin` of the fp32 freqs and casts them
to the activation dtype: 2 x (r4 w4 + r4 w2) = 28 B per rot_dim element per call, two calls.

"rope-legacy": megatron/model/rotary_pos_embedding.py of microsoft/Megatron-DeepSpeed
@6d4c535e: the same arithmetic with `unbind` instead of `chunk` and no final cat when t_pass
is empty. Forward 2 + 1 + 2 + 2 + 3 = 10; backward 2 + 2 + 1 + 2 (unbind's backward stacks
the halves' gradients) + 3 + 3 (the slice) = 13; the same freqs cos / sin.

"swiglu": the legacy `ParallelMLP` swiglu, `F.silu(chunk(x)[0]) * chunk(x)[1]`
(FlagScale @26cd664 / Megatron-DeepSpeed @6d4c535e megatron/model/transformer.py), per element
of the ffn output f: silu r1 w1 = 2, mul r2 w1 = 3: forward 5; backward: the mul's two input
gradients r2 w1 each = 6, silu's backward r2 w1 = 3, the chunk's backward concatenates the two
f-sized gradients r2 w2 = 4: 13. With an fc1 bias (`skip_bias_add=True`, added before the
activation outside the GEMM) also the add r2 w2 = 4 forward (per f: the fc1 output is 2f) and
the bias gradient's reduction r2 = 2 backward. The dense MLP only (MoE experts keep their
kernels).

RoPE after the K, V repeat: a fused layer whose recipe also expands grouped K, V to every query
head (`gqa_repeat_kv`) is FlagScale's legacy layer, which does so (`repeat_interleave`,
transformer.py l. 855-864 @26cd664) before its unfused RoPE (l. 866-869), so the RoPE runs on a
K heads, not kv_heads (the copies themselves are `gqa_repeat_kv`'s). Megatron-Core's own layers
never repeat K, V; eager recipes (torchtitan's `repeat_kv` after RoPE) are not costed here.

"qkv-slice": Megatron-DeepSpeed's `split_tensor` (microsoft/Megatron-DeepSpeed @6d4c535e, the
same file at FlagPerf's image pin 11f2d934, megatron/model/transformer.py l. 641-644): the fused
QKV output viewed [s, b, kv groups, g + 2, d] gives q as a slice (reshaped), k and v as `select`s
of it. Backward, PyTorch's `slice_backward` / `select_backward` each fill a zeros tensor of the
whole QKV output and copy their gradient into their part, and the three are summed: per element
of the QKV output (Q = (a·dqk + kvh·(dqk + dv)) / tp per token) zeros 3 x w1, the copies r1 w1
on their parts (2 in all), two sums r2 w1 each (6): 11; Megatron-Core's `torch.split`, whose
backward is one cat (r1 w1: 2), is left in the fused baseline with the rest of its layer, so 9
are charged. Forward, the FlashAttention path's `rearrange(x, 's b ... -> b s ...')
.contiguous()` (l. 799-800) copies v, a strided select (r1 w1 per v element); with a micro-batch
over 1 the s, b transpose also copies q and k, and the attention output's `rearrange(...,
'b s h d -> s b (h d)').contiguous()` (l. 809) copies it (r1 w1 per q, k and output element).

The fused counts `layer_factors._elementwise_bytes_fwd` gives these ops (RoPE read + write,
SwiGLU read 2f write f, backward ELEMENTWISE_BWD_FACTOR x forward) are left out for the ops
named here and these counts added instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel_cp.cost.attention_padding import unpad_pad_bytes
from autoparallel_cp.cost.common import CostOptions, FloatArray, _fused
from autoparallel_cp.cost.flops import attention_dims
from autoparallel_cp.spec import Job, ModelSpec

#: (forward, backward) bytes per q/k element of the unfused RoPE, in activation-dtype units
ROPE_RW = {"rope": (12.0, 17.0), "rope-legacy": (10.0, 13.0)}
#: fp32 freqs -> cos, sin -> activation dtype, per rot_dim element per call (q and k: 2 calls)
ROPE_FREQS_BYTES_PER_CALL = 2 * (4.0 + 4.0 + 4.0 + 2.0)
#: (forward, backward) bytes per ffn-output element of the unfused SwiGLU, activation units
SWIGLU_RW = (5.0, 13.0)
#: (forward, backward) of the fc1 bias added before the unfused activation, per ffn element
SWIGLU_BIAS_RW = (4.0, 2.0)
#: backward bytes per QKV-output element of Megatron-DeepSpeed's slice/select split beyond
#: Megatron-Core's split (11 - 2, module docstring), activation units
QKV_SLICE_BWD = 9.0
#: forward bytes per copied element (read + write) of the legacy FlashAttention path's copies
COPY_RW = 2.0


@dataclass(frozen=True)
class UnfusedBytes:
    """Per-token HBM bytes of a layer's unfused ops: forward and backward."""

    fwd: FloatArray
    bwd: FloatArray


def rope_unfused(ops: tuple[str, ...], model: ModelSpec) -> str | None:
    """The unfused RoPE variant of `ops` that applies to `model` (None: RoPE stays fused)."""
    if model.position_embedding != "rope" or model.mla is not None:
        return None
    return next((o for o in ops if o in ROPE_RW), None)


def swiglu_unfused(ops: tuple[str, ...], model: ModelSpec, moe: bool) -> bool:
    """The dense MLP's SwiGLU runs as its PyTorch ops."""
    return "swiglu" in ops and model.mlp == "swiglu" and not moe


def unfused_op_bytes(model: ModelSpec, ops: tuple[str, ...], moe: bool, ab: float,
                     tp: FloatArray, mbs: FloatArray, kv_repeated: bool = False
                     ) -> UnfusedBytes:
    """Forward and backward HBM bytes per token of the layer's `ops` (module docstring).

    q has a, k kv_heads heads of dqk (a when `kv_repeated`: K was expanded to every query head
    before the RoPE), tp-sharded; the freqs are per sequence position, so per token of the
    micro-batch they divide by its batch size `mbs`.
    """
    fwd = np.zeros(np.broadcast_shapes(np.shape(tp), np.shape(mbs)))
    bwd = fwd.copy()
    rope = rope_unfused(ops, model)
    if rope is not None:
        a, dqk, _ = attention_dims(model)
        k_heads = a if kv_repeated else model.kv_heads
        elems = (a + k_heads) * dqk / tp
        f, b = ROPE_RW[rope]
        fwd = fwd + f * ab * elems + 2 * ROPE_FREQS_BYTES_PER_CALL * dqk / mbs
        bwd = bwd + b * ab * elems
    if swiglu_unfused(ops, model, moe):
        ffn = model.ffn_hidden_size / tp
        f, b = SWIGLU_RW
        if model.mlp_bias:
            f, b = f + SWIGLU_BIAS_RW[0], b + SWIGLU_BIAS_RW[1]
        fwd = fwd + f * ab * ffn
        bwd = bwd + b * ab * ffn
    if "qkv-slice" in ops and model.mla is None:
        a, dqk, dv = attention_dims(model)
        kvh = model.kv_heads
        qkv = (a * dqk + kvh * (dqk + dv)) / tp
        transposed = np.where(np.asarray(mbs) > 1, ((a + kvh) * dqk + a * dv) / tp, 0.0)
        fwd = fwd + COPY_RW * ab * (kvh * dv / tp + transposed)
        bwd = bwd + QKV_SLICE_BWD * ab * qkv
    return UnfusedBytes(fwd=fwd, bwd=bwd)


def active_ops(job: Job, options: CostOptions) -> tuple[str, ...]:
    """The recipe's `unfused_ops` where its layer is otherwise fused; an eager layer
    (`fused` False) is costed whole by its eager path."""
    return tuple(options.unfused_ops) if _fused(job.recipe, options) else ()


def layer_unfused_bytes(job: Job, options: CostOptions, moe: bool, tp: FloatArray,
                        mbs: FloatArray) -> UnfusedBytes:
    """`unfused_op_bytes` of the job's layer under `options` (zero when none apply), plus the
    unpad / pad copies around a variable-length attention call when the recipe's behaviour
    has `attention_unpad` (cost/attention_padding.py; PyTorch index ops, fused or not)."""
    ab = float(job.recipe.activation_bytes)
    ub = unfused_op_bytes(job.model, active_ops(job, options), moe, ab, tp, mbs,
                          kv_repeated=options.gqa_repeat_kv)
    if not options.attention_unpad:
        return ub
    f, b = unpad_pad_bytes(job.model, ab, tp)
    return UnfusedBytes(fwd=ub.fwd + f, bwd=ub.bwd + b)
