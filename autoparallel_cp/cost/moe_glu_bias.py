"""Unfused per-token work of Megatron-Core's grouped experts with a clamped GLU and expert
biases (GPT-OSS: `activation_func_clamp_value` 7.0, `add_bias_linear`), behaviour
`moe_glu_clamp_bias`.

Megatron-Core `TEGroupedMLP.forward` (megatron/core/transformer/moe/experts.py, identical at
core_v0.15.0, core_v0.17.0 and core_v0.18.0, the Megatron Core of the NeMo 25.11, 26.04 and
26.06 containers, Megatron-Bridge docs/releases/software-versions.md @067f987), the path
without the Transformer Engine op fuser (`use_transformer_engine_op_fuser` False, the GPT-OSS
BF16 perf recipes and pretrain recipes), does two things eagerly on the routed copies:

1. Clamp before the fused activation: `weighted_bias_quick_geglu_impl`
   (megatron/core/fusions/fused_bias_geglu.py) chunks the fc1 output [N, 2F] into its gate
   and linear halves, clamps each (`clamp(max=c)`, `clamp(-c, c)`: two kernels, read + write)
   and concatenates them (`torch.cat`: read + write) before the compiled quick-GEGLU: forward
   2 x (read + write) of the [N, 2F] activation-dtype tensor = 4·ab bytes per element.
   Backward: each clamp's gradient reads the upstream gradient and the saved clamp input and
   writes the gradient (3·ab over both halves), and the chunk's backward concatenates the two
   halves' gradients into the fc1-output gradient (read + write, 2·ab): 5·ab per element.
   The clamp saves its input (the unclamped fc1 output) beside the concatenated copy the
   activation saves: ab more bytes kept per element, unless `moe_act` recompute checkpoints
   the whole activation function (it then replays the forward chain in backward).
2. The fc2 bias outside the GEMM: fc2 is built with `skip_bias_add=True` and `_apply_bias`
   adds `b * p` (bias [H] in the activation dtype times the fp32 router probability [n, 1])
   per local expert over `torch.split` chunks, then `torch.cat` and `.to(dtype)`. PyTorch's
   type promotion makes `b * p`, the sum and the cat fp32. Forward per element of the
   [N, H] fc2 output: `b * p` writes 4; `t + b·p` reads ab + 4, writes 4; cat reads 4,
   writes 4; cast reads 4, writes ab: 24 + 2·ab bytes. Backward (autograd of the same ops):
   cast-back reads ab, writes 4; the add's gradient to the ab-dtype `t` is cast (read 4,
   write ab); MulBackward forms grad·p (read 4, write 4) and reduces it to the bias (read 4),
   and grad·b (read 4, write 4) reduced to the probability (read 4); the split's backward
   concatenates the chunks' gradients (read ab, write ab): 32 + 4·ab bytes.

N counts the routed copies an expert rank holds per token of the micro-batch: top_k·2F/tp
elements of the fc1 output (the activation's scaling, `layer_factors._elementwise_bytes_fwd`)
and top_k·H·`expert_token_factor` of the fc2 output (the permute copies' scaling). Costed at
HBM bandwidth like every other memory-bound op (`efficiency.hbm_time`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel_cp.cost.common import ArrayLike, FloatArray, _f
from autoparallel_cp.cost.flops import expert_token_factor
from autoparallel_cp.spec import ModelSpec

#: fp32 element size: `b * p` promotes to the router probabilities' dtype.
_FP32 = 4.0


@dataclass(frozen=True)
class GluBiasBytes:
    """HBM bytes per token of a layer's micro-batch on one expert rank."""

    clamp_fwd: FloatArray  # clamp + cat forward (replayed by moe_act recompute)
    clamp_bwd: FloatArray
    bias_fwd: FloatArray  # fc2 bias loop forward (never replayed: outside the checkpoint)
    bias_bwd: FloatArray
    clamp_saved: FloatArray  # the unclamped fc1 output the clamp keeps for backward


def glu_clamp_bias_bytes(model: ModelSpec, act_bytes: float, tp: ArrayLike,
                         etp: ArrayLike | None = None,
                         load: ArrayLike = 1.0) -> GluBiasBytes:
    """Per-token bytes of the clamp chain and the eager fc2 bias (module docstring); every term
    is the rank's routed copies, so all scale with `load` (`common.routed_load`)."""
    tp_ = _f(tp)
    mo = model.moe
    if mo is None:
        z = np.zeros_like(tp_)
        return GluBiasBytes(z, z, z, z, z)
    ab = float(act_bytes)
    ld = _f(load)  # per-rank routed work: the most-loaded rank's N
    fc1_out = mo.top_k * 2.0 * mo.expert_ffn_hidden_size / tp_ * ld  # [N, 2F] per token
    fc2_out = mo.top_k * float(model.hidden_size) * expert_token_factor(tp_, etp) * ld
    return GluBiasBytes(
        clamp_fwd=4.0 * ab * fc1_out,
        clamp_bwd=5.0 * ab * fc1_out,
        bias_fwd=(6.0 * _FP32 + 2.0 * ab) * fc2_out,
        bias_bwd=(8.0 * _FP32 + 4.0 * ab) * fc2_out,
        clamp_saved=ab * fc1_out,
    )
