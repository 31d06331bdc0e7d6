"""Where an MoE layer applies its router probabilities, and what that keeps for backward
(recipe behaviour `moe_prob_scaling`).

Megatron-Core 0.13 and later (commit 2659630721 "Memory efficient token permutation";
megatron/core/transformer/moe/experts.py @d98e8a64 `bias_act_func` / `weighted_bias_swiglu_impl`)
scale the experts' activation output by the permuted probabilities, keeping only those fp32
probabilities beside the fc1 output the SwiGLU saves anyway, and unpermute without
probabilities (token_dispatcher.py: `unpermute(..., probs` not passed). Earlier versions
scaled at the unpermute and kept the expert outputs for the probabilities' gradient.
Expected bytes are derived by hand per token for a toy Megatron MoE layer (bf16, tp 1, flash
attention, fused SwiGLU, no dropout).
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.spec import (
    RECIPES,
    Job,
    ModelSpec,
    MoESpec,
)
from tests.cost.toy_cluster import h100_cluster

H, HEADS, FFN_E, K, E = 1024, 8, 512, 4, 16
S = 2048


def _job(scaling: str) -> Job:
    m = ModelSpec(name="toy-moe", num_layers=2, hidden_size=H, ffn_hidden_size=4096,
                  num_attention_heads=HEADS, num_kv_heads=HEADS, vocab_size=32000,
                  moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=FFN_E))
    rec = RECIPES["megatron-bf16"].with_behaviour(moe_prob_scaling=scaling)
    return Job(model=m, cluster=h100_cluster(), recipe=rec, seq_len=S, global_batch=8)


# Bytes per token, by hand (all bf16 = 2 B unless said):
# attention: norm-1 input 2H, QKV input 2H, q / k / v / output 2H each (8 heads x 128),
# fp32 logsumexp 4 x 8 heads
ATTN = 2 * H + 2 * H + 4 * 2 * H + 4 * HEADS
# MoE block: norm-2 input 2H, router input 2H, fp32 router logits + probabilities 2 x 4 x E,
# dispatched tokens K x 2H (the grouped fc1's input), per routed copy the fused SwiGLU's
# input (gate + up, 2 x 2 x FFN_E) and the fc2 input (2 x FFN_E)
BLOCK = 2 * H + 2 * H + 2 * 4 * E + K * 2 * H + K * (2 * 2 * FFN_E + 2 * FFN_E)


def test_probabilities_in_the_activation_keep_one_fp32_value_per_routed_copy() -> None:
    lf = layer_factors(_job("activation"), 0, 1, 1, 1, 0, 1, "none", moe=True)
    assert float(lf.act_bytes) == pytest.approx((ATTN + BLOCK + 4 * K) * S)


def test_probabilities_at_the_combine_keep_the_expert_outputs() -> None:
    lf = layer_factors(_job("combine"), 0, 1, 1, 1, 0, 1, "none", moe=True)
    assert float(lf.act_bytes) == pytest.approx((ATTN + BLOCK + K * 2 * H) * S)


def test_the_default_is_megatron_core_of_today() -> None:
    """The recipe default describes Megatron-Core @d98e8a64 (the activation applies them)."""
    assert RECIPES["megatron-bf16"].behaviour.moe_prob_scaling == "activation"


def test_dense_layers_do_not_change() -> None:
    a = layer_factors(_job("activation"), 0, 1, 1, 1, 0, 1, "none", moe=False)
    c = layer_factors(_job("combine"), 0, 1, 1, 1, 0, 1, "none", moe=False)
    assert float(a.act_bytes) == float(c.act_bytes)
