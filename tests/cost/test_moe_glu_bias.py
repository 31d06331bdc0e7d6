"""Megatron-Core's eager clamp chain and fp32 fc2 bias in grouped experts with a clamped GLU
and expert biases (GPT-OSS; behaviour `moe_glu_clamp_bias`, cost/moe_glu_bias.py).

Expected bytes are counted by hand from the ops of megatron/core/transformer/moe/experts.py
`TEGroupedMLP.forward` / `_apply_bias` and fusions/fused_bias_geglu.py
`weighted_bias_quick_geglu_impl` (core_v0.15.0 .. core_v0.18.0), bf16 activations (2 B), fp32
router probabilities (4 B).
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.cost.moe_glu_bias import glu_clamp_bias_bytes
from autoparallel_cp.spec import (
    RECIPES,
    Job,
    ModelSpec,
    MoESpec,
)
from tests.cost.toy_cluster import h100_cluster

# GPT-OSS 120B widths (Megatron-Bridge docs/models/gpt_oss/gpt-oss.md): hidden 2880, expert
# FFN 2880, top-4 of 128
H, F, K, E = 2880, 2880, 4, 128
S = 4096
GPU = h100_cluster().node_groups[0].gpu


def _model() -> ModelSpec:
    return ModelSpec(name="gpt-oss-like", num_layers=2, hidden_size=H, ffn_hidden_size=F,
                     num_attention_heads=64, num_kv_heads=8, head_dim=64, vocab_size=201088,
                     moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=F))


def _job(on: bool, modules: tuple[str, ...] = ("core_attn",)) -> Job:
    rec = RECIPES["megatron-bf16"].with_behaviour(moe_glu_clamp_bias=on,
                                                  recompute_modules=modules)
    return Job(model=_model(), cluster=h100_cluster(), recipe=rec, seq_len=S, global_batch=8)


# Per token at tp 1: the fc1 output holds K x 2F elements, the fc2 output K x H.
# clamp chain forward: clamp(max) + clamp(-c, c) read + write each half (2 + 2 B per element
# over the whole tensor), cat read + write (2 + 2): 8 B per fc1-output element.
CLAMP_FWD = 8 * K * 2 * F
# backward: clamp gradients read grad + input, write grad (2 + 2 + 2), the chunk's backward
# concatenates the halves' gradients (2 + 2): 10 B.
CLAMP_BWD = 10 * K * 2 * F
# fc2 bias forward: b*p writes fp32 (4); t + b*p reads 2 + 4, writes 4; cat reads 4, writes 4;
# cast reads 4, writes 2: 28 B per fc2-output element.
BIAS_FWD = 28 * K * H
# backward: cast-back reads 2 writes 4; the add's gradient cast to bf16 reads 4 writes 2;
# grad*p reads 4 writes 4 and its reduction reads 4; grad*b the same (8 + 4); the split's
# backward cat reads 2 writes 2: 40 B.
BIAS_BWD = 40 * K * H


def test_bytes_per_token_at_tp1() -> None:
    b = glu_clamp_bias_bytes(_model(), 2.0, 1)
    assert float(b.clamp_fwd) == pytest.approx(CLAMP_FWD)
    assert float(b.clamp_bwd) == pytest.approx(CLAMP_BWD)
    assert float(b.bias_fwd) == pytest.approx(BIAS_FWD)
    assert float(b.bias_bwd) == pytest.approx(BIAS_BWD)
    assert float(b.clamp_saved) == pytest.approx(2 * K * 2 * F)


def test_folded_expert_tp1_under_tp2_halves_both_tensors() -> None:
    """tp 2 with expert-TP 1: each rank holds half the routed copies at full width."""
    b = glu_clamp_bias_bytes(_model(), 2.0, 2, 1)
    assert float(b.clamp_fwd) == pytest.approx(CLAMP_FWD / 2)
    assert float(b.bias_bwd) == pytest.approx(BIAS_BWD / 2)


def test_layer_time_adds_the_passes_at_hbm_bandwidth() -> None:
    off = layer_factors(_job(False), 0, 1, 1, 8, 0, 1, "none", moe=True)
    on = layer_factors(_job(True), 0, 1, 1, 8, 0, 1, "none", moe=True)
    extra = float(hbm_time(GPU, (CLAMP_FWD + CLAMP_BWD + BIAS_FWD + BIAS_BWD) * S))
    assert float(on.compute_s - off.compute_s) == pytest.approx(extra, rel=1e-9)
    # full recompute replays the forward passes
    assert float(on.rc_compute_s - off.rc_compute_s) == pytest.approx(
        float(hbm_time(GPU, (CLAMP_FWD + BIAS_FWD) * S)), rel=1e-9)


def test_the_clamp_keeps_the_unclamped_fc1_output() -> None:
    off = layer_factors(_job(False), 0, 1, 1, 8, 0, 1, "none", moe=True)
    on = layer_factors(_job(True), 0, 1, 1, 8, 0, 1, "none", moe=True)
    assert float(on.act_bytes - off.act_bytes) == pytest.approx(2 * K * 2 * F * S)


def test_moe_act_recompute_drops_the_copy_and_replays_the_clamp_chain() -> None:
    mods = ("layernorm", "moe_act")
    off = layer_factors(_job(False, mods), 0, 1, 1, 8, 0, 1, "selective", moe=True)
    on = layer_factors(_job(True, mods), 0, 1, 1, 8, 0, 1, "selective", moe=True)
    assert float(on.act_bytes) == pytest.approx(float(off.act_bytes))
    replay = float(hbm_time(GPU, CLAMP_FWD * S))
    extra = float(hbm_time(GPU, (CLAMP_FWD + CLAMP_BWD + BIAS_FWD + BIAS_BWD) * S))
    assert float(on.compute_s - off.compute_s) == pytest.approx(extra + replay, rel=1e-9)


def test_off_by_default_and_dense_layers_unchanged() -> None:
    assert RECIPES["megatron-bf16"].behaviour.moe_glu_clamp_bias is False
    off = layer_factors(_job(False), 0, 1, 1, 1, 0, 1, "none", moe=False)
    on = layer_factors(_job(True), 0, 1, 1, 1, 0, 1, "none", moe=False)
    assert float(on.compute_s) == float(off.compute_s)
    assert float(on.act_bytes) == float(off.act_bytes)
