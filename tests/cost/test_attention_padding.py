"""Unpad / pad copies around llm-foundry's flash-attention call, by hand.

Per element (flash-attn v2.4.2 bert_padding.py): unpad forward gathers the rows (read + write),
backward zero-fills and scatters (write, read + write); pad forward zero-fills and index-puts
(write, read + write), backward gathers (read + write). bf16: 2 bytes per read or write.
"""

from __future__ import annotations

import pytest
from toy_cluster import h100_cluster

from autoparallel_cp.cost.attention_padding import unpad_pad_bytes
from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.layer_factors import layer_factors
from autoparallel_cp.spec import RECIPES, Job, ModelSpec


def _model(kv: int = 32) -> ModelSpec:
    return ModelSpec(name="m", num_layers=2, hidden_size=4096, ffn_hidden_size=16384,
                     num_attention_heads=32, num_kv_heads=kv, vocab_size=50368,
                     position_embedding="alibi", mlp="gelu", norm="layernorm")


def test_multi_head_layer() -> None:
    """h = 4096 (32 x 128), tp 1: forward q, k, v gathers 3 x 4096 x 4 B + output 4096 x 6 B
    = 73,728 B; backward 3 x 4096 x 6 B + 4096 x 4 B = 90,112 B per token."""
    f, b = unpad_pad_bytes(_model(), 2.0, 1.0)
    assert float(f) == pytest.approx(73728.0)
    assert float(b) == pytest.approx(90112.0)


def test_grouped_query_layer_over_two_tp_ranks() -> None:
    """32 query heads, 8 kv heads of 128, tp 2: q, k, v 3,072 and output 2,048 elements per
    rank; forward 3,072 x 4 + 2,048 x 6 = 24,576 B, backward 3,072 x 6 + 2,048 x 4 = 26,624 B."""
    f, b = unpad_pad_bytes(_model(kv=8), 2.0, 2.0)
    assert float(f) == pytest.approx(24576.0)
    assert float(b) == pytest.approx(26624.0)


@pytest.mark.parametrize("mode", ["none", "full"])
def test_layer_time_grows_by_the_copies(mode: str) -> None:
    """The layer's compute grows by the copies' HBM time for mbs 2 x 2,048 tokens, forward and
    backward; the replay a full recompute adds (`rc_compute_s`, priced for either mode) grows
    by the forward copies."""
    base = RECIPES["pytorch-fsdp"].with_behaviour(attention_kernel="fa2")
    jobs = [Job(model=_model(), cluster=h100_cluster(), recipe=r, seq_len=2048,
                global_batch=16) for r in (base, base.with_behaviour(attention_unpad=True))]
    off, on = (layer_factors(j, 0, 1, 1, 1, 0, 2, mode) for j in jobs)
    gpu = jobs[0].cluster.node_groups[0].gpu
    tokens = 2 * 2048
    fwd, bwd = float(hbm_time(gpu, 73728.0 * tokens)), float(hbm_time(gpu, 90112.0 * tokens))
    assert float(on.compute_s - off.compute_s) == pytest.approx(fwd + bwd, rel=1e-6)
    assert float(on.rc_compute_s - off.rc_compute_s) == pytest.approx(fwd, rel=1e-6)
