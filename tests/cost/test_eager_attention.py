"""Hugging Face eager attention (Baichuan2-13B's scale / ALiBi mask / clamp / softmax chain)
against Megatron's fused scale-mask-softmax, by hand.

Per score element in bf16 (2 B a pass): forward scale r+w, mask add r+r+w, clamp r+w, softmax
r+w = 9 passes = 18 B (fused: 2 passes = 4 B); backward softmax r+r+w, `maximum`'s gradient
(grad / 2 r+w, self == other r, where r+r+w, self < other r, masked_fill_ r+w) 9 passes, the
scale's gradient r+w: 14 passes = 28 B, plus two 1-byte bool masks written and read = 4 B,
32 B in all (fused: 2 x 4 = 8 B).
"""

from __future__ import annotations

import pytest
from toy_cluster import h100_cluster

from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.layer_factors import layer_factors
from autoparallel_cp.spec import RECIPES, Job, ModelSpec


def _job(eager: bool, dropout: bool = False) -> Job:
    model = ModelSpec(name="m", num_layers=2, hidden_size=4096, ffn_hidden_size=11008,
                      num_attention_heads=32, num_kv_heads=32, vocab_size=32000,
                      position_embedding="alibi", mlp="swiglu", norm="rmsnorm")
    recipe = RECIPES["deepspeed"].model_copy(update={"flash_attention": False})
    recipe = recipe.with_behaviour(
        fused=False, dropout=dropout,
        eager_attention="scale-mask-clamp" if eager else "fused")
    return Job(model=model, cluster=h100_cluster(), recipe=recipe, seq_len=2048,
               global_batch=16)


@pytest.mark.parametrize("mode", ["none", "full"])
def test_eager_chain_adds_its_passes(mode: str) -> None:
    """mbs 2, 32 heads, s = 2,048 at tp 2: 2 x 16 x 2,048^2 = 134,217,728 score elements per
    rank. Forward grows by (18 - 4) B each, backward by (32 - 8) B; a full recompute's replay
    (`rc_compute_s`) by the forward's share."""
    fused, eager = (layer_factors(_job(e), 0, 2, 1, 1, 0, 2, mode) for e in (False, True))
    gpu = _job(False).cluster.node_groups[0].gpu
    elems = 2 * 16 * 2048 * 2048
    fwd = float(hbm_time(gpu, (18.0 - 4.0) * elems))
    bwd = float(hbm_time(gpu, (32.0 - 8.0) * elems))
    assert float(eager.compute_s - fused.compute_s) == pytest.approx(fwd + bwd, rel=1e-6)
    assert float(eager.rc_compute_s - fused.rc_compute_s) == pytest.approx(fwd, rel=1e-6)


def test_dropout_traffic_is_kept() -> None:
    """Dropout's 5 B per score element forward (and 10 backward) stays on top of either chain:
    the eager chain's increment is the same with and without dropout."""
    gap = [float(layer_factors(_job(True, d), 0, 1, 1, 1, 0, 1, "none").compute_s
                 - layer_factors(_job(False, d), 0, 1, 1, 1, 0, 1, "none").compute_s)
           for d in (False, True)]
    assert gap[1] == pytest.approx(gap[0], rel=1e-9)
    assert gap[0] > 0.0


def test_flash_attention_ignores_the_field() -> None:
    """With a flash kernel there are no materialized scores: the field changes nothing."""
    jobs = [_job(e) for e in (False, True)]
    jobs = [j.model_copy(update={"recipe": j.recipe.model_copy(update={"flash_attention": True})})
            for j in jobs]
    a, b = (layer_factors(j, 0, 1, 1, 1, 0, 1, "none") for j in jobs)
    assert float(a.compute_s) == float(b.compute_s)


def test_clamp_keeps_the_masked_scores() -> None:
    """`maximum` saves its input: one more bf16 score tensor per layer and micro-batch, 2 B x
    32 heads / tp 2 x 2,048 keys per token, on top of the softmax output the fused path keeps;
    nothing else of the activations moves."""
    from autoparallel_cp.cost.activations import layer_activation_per_token

    fused, eager = (layer_activation_per_token(_job(e), False, 2, 1, 1, 0) for e in (False, True))
    assert float(eager.core - fused.core) == pytest.approx(2.0 * 16 * 2048)
    assert float(eager.kept) == float(fused.kept)
