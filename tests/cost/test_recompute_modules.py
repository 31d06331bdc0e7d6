"""Megatron-Core `--recompute-modules` under `recompute=selective` (recipe behaviour).

Expected values are derived by hand in each test from what each module's checkpoint discards
(megatron/core/transformer/transformer_config.py `recompute_modules`): output-discarding
modules free the tensor the next op saved; normally checkpointed modules keep only their input.
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.common import node
from autoparallel_cp.cost.efficiency import HBM_EFFICIENCY
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.spec import (
    RECIPES,
    FrameworkBehaviour,
    Job,
    ModelSpec,
    MoESpec,
)
from tests.cost.toy_cluster import h100_cluster

H, FFN_E, K, E = 1024, 512, 4, 16
S, MBS = 2048, 1
HBM = 3350e9  # the toy GPU's HBM bandwidth, bytes/s


def _job(recipe: str = "megatron-bf16", modules: tuple[str, ...] = ("core_attn",),
         moe: bool = True) -> Job:
    m = ModelSpec(name="toy-moe", num_layers=2, hidden_size=H, ffn_hidden_size=4096,
                  num_attention_heads=8, num_kv_heads=8, vocab_size=32000,
                  moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=FFN_E)
                  if moe else None)
    rec = RECIPES[recipe].with_behaviour(recompute_modules=modules)
    return Job(model=m, cluster=h100_cluster(hbm_gbps=HBM / 1e9), recipe=rec, seq_len=S,
               global_batch=8)


def _lf(job: Job, mode: str, ep: int = 1, moe: bool = True):  # type: ignore[no-untyped-def]
    return layer_factors(job, 0, 1, 1, ep, 0, MBS, mode, moe=moe)


def _gpu(lf) -> float:  # type: ignore[no-untyped-def]
    """GPU compute of a layer: its compute less the MoE host-wait exposure (moe_host.py)."""
    return float(lf.compute_s - lf.host_s)


def test_default_core_attn_is_the_attention_policy_of_before() -> None:
    """With flash attention the attention core keeps nothing extra: selective = none bytes,
    and the replay is the attention forward only (Korthikanti §5, flash)."""
    job = _job()
    none, sel = _lf(job, "none"), _lf(job, "selective")
    assert float(sel.act_bytes) == pytest.approx(float(none.act_bytes))
    assert _gpu(sel) > _gpu(none)


def test_layernorm_and_moe_act_in_bf16() -> None:
    """bf16: the two norm outputs are the bf16 inputs the QKV and router/fc1 linears saved
    (2 x 2 B x h per token); moe_act frees each routed copy's SwiGLU output, the fc2 input
    (top_k x 2 B x ffn_e). GPT-OSS's Megatron-Bridge recipe sets exactly these two."""
    tokens = MBS * S
    none = _lf(_job(modules=()), "selective")
    both = _lf(_job(modules=("layernorm", "moe_act")), "selective")
    expected = (2 * 2 * H + K * 2 * FFN_E) * tokens
    assert float(none.act_bytes) - float(both.act_bytes) == pytest.approx(expected)
    # replay: two norms read their input and write their output (2 x (2 + 2) B x h) and the
    # SwiGLU reads gate + up and writes its output per copy (3 x 2 B x ffn_e x top_k), all at
    # the HBM rate (HBM_EFFICIENCY of the spec bandwidth)
    replay_bytes = (2 * 4 * H + K * 3 * 2 * FFN_E) * tokens
    assert _gpu(both) - _gpu(none) == pytest.approx(
        replay_bytes / (HBM * HBM_EFFICIENCY), rel=1e-9)


def test_layernorm_frees_nothing_under_te_fp8() -> None:
    """TE fp8 linears save their own 1-byte copy of the input; the bf16 norm output is not
    saved, so discarding it frees nothing. moe_act frees the fp8 fc2 input: top_k x 1 B x ffn_e."""
    tokens = MBS * S
    none = _lf(_job("megatron-fp8", ()), "selective")
    ln = _lf(_job("megatron-fp8", ("layernorm",)), "selective")
    act = _lf(_job("megatron-fp8", ("moe_act",)), "selective")
    assert float(ln.act_bytes) == pytest.approx(float(none.act_bytes))
    assert float(none.act_bytes) - float(act.act_bytes) == pytest.approx(K * 1 * FFN_E * tokens)


def test_mlp_module_on_a_dense_layer() -> None:
    """"mlp" checkpoints the dense MLP at its input: its fc1 output (gate + up, 2 x 2 B x ffn)
    and fc2 input (2 B x ffn) are freed, and its two GEMMs replay in backward."""
    ffn = 4096
    tokens = MBS * S
    none = _lf(_job(modules=(), moe=False), "selective", moe=False)
    mlp = _lf(_job(modules=("mlp",), moe=False), "selective", moe=False)
    assert float(none.act_bytes) - float(mlp.act_bytes) == pytest.approx(6 * ffn * tokens)
    assert _gpu(mlp) > _gpu(none)
    # the module is the dense MLP only: on an MoE layer it frees nothing
    moe_none = _lf(_job(modules=()), "selective")
    moe_mlp = _lf(_job(modules=("mlp",)), "selective")
    assert float(moe_mlp.act_bytes) == pytest.approx(float(moe_none.act_bytes))


def test_moe_module_replays_dispatch_and_combine() -> None:
    """"moe" checkpoints the whole MoE block: its backward replays the forward dispatch and
    combine, so the layer's EP time is 3 all-to-all pairs (forward, replay, backward) instead
    of 2 — 1.5x — and it frees at least what moe_act alone frees."""
    job_moe = _job(modules=("moe",))
    none = _lf(job_moe, "none", ep=8)
    sel = _lf(job_moe, "selective", ep=8)
    assert float(none.ep_s) > 0
    assert float(sel.ep_s) == pytest.approx(1.5 * float(none.ep_s))
    act_only = _lf(_job(modules=("moe_act",)), "selective", ep=8)
    assert float(sel.act_bytes) < float(act_only.act_bytes)
    # the all-to-all itself: top_k copies of h in bf16 per token over 8 NVLink ranks
    a2a = comm.all_to_all(node(job_moe, 0), 8, 1, MBS * S * K * H * 2.0)
    assert float(none.ep_s) == pytest.approx(4 * float(a2a))


def test_unknown_module_is_refused() -> None:
    """Only Megatron's module names are accepted (a recipe file with a typo is exit 2)."""
    with pytest.raises(ValueError, match="recompute_modules"):
        FrameworkBehaviour.model_validate({"recompute_modules": ["attention"]})
