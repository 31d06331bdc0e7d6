"""Host time Megatron-Core's MoE layer cannot hide behind a host wait (cost/moe_host.py).

Expected values are counted by hand from the module docstring's list of host operations
(Megatron-Core d7288711, Transformer Engine v2.9 grouped_linear.py) and the in-order issue
bound max(c + G1 + G2, H1 + G2, H1 + H2), c = 13.48 us (TE issue #2053, DGX H100 torch Linear).
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost.constants import EAGER_HOST_S_PER_LAYER
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.cost.moe_host import host_ops, moe_host_exposed, sync_exposed
from autoparallel_cp.spec import RECIPES, Job, ModelSpec, MoESpec
from tests.cost.toy_cluster import h100_cluster

C = 13.48e-6


def _job(recipe: str = "megatron-bf16", shared: int = 0, hidden: int = 2048,
         seq: int = 4096, **behaviour: object) -> Job:
    model = ModelSpec(name="qwen3-30b-like", num_layers=2, hidden_size=hidden,
                      ffn_hidden_size=hidden * 3, num_attention_heads=32, num_kv_heads=4,
                      head_dim=hidden // 32, vocab_size=151936,
                      moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=hidden // 8 * 3,
                                  num_shared_experts=shared))
    rec = RECIPES[recipe].with_behaviour(**behaviour) if behaviour else RECIPES[recipe]
    return Job(model=model, cluster=h100_cluster(), recipe=rec, seq_len=seq, global_batch=8)


def test_segment_bound_three_regimes() -> None:
    # GPU-bound: max(4 + c, 2.5, 1) - 4 = c
    assert float(sync_exposed(0.5, 0.5, 2.0, 2.0, c=0.1)) == pytest.approx(0.1)
    # host-bound over the whole segment: max(2.1, 4, 4) - 2 = 2
    assert float(sync_exposed(3.0, 1.0, 1.0, 1.0, c=0.1)) == pytest.approx(2.0)
    # the GPU idles while the host issues block 1, then runs block 2: max(4.1, 5, 2) - 4 = 1
    assert float(sync_exposed(2.0, 0.0, 1.0, 3.0, c=0.1)) == pytest.approx(1.0)


def test_op_counts_alltoall_bf16() -> None:
    post, pre, bwd = host_ops(_job(), RECIPES["megatron-bf16"].behaviour, 16, 1)
    # dispatch/combine 8 + experts 13 + 16 experts x 2 GroupedLinears x 1 GEMM launch
    assert float(post) == 8 + 13 + 32
    # attention 13 + router 14 + preprocess 21
    assert float(pre) == 13 + 14 + 21
    # nodes: attention 9, router 6, permute 1, dispatch 6, experts 3, 2 x 4 GroupedLinear
    # ops, 32 x (dgrad, wgrad, bookkeeping)
    assert float(bwd) == 9 + 6 + 1 + 6 + 3 + 8 + 32 * 3


def test_op_counts_fp8_graphs_tp_flex_shared() -> None:
    job = _job("megatron-fp8")
    post, pre, bwd = host_ops(job, job.recipe.behaviour, 16, 1)
    assert float(post) == 8 + 13 + 3 + 32 * 3  # + paddings, quantize and weight workspace
    assert float(bwd) == 9 + 6 + 1 + 6 + 3 + 3 + 8 + 32 * 4
    g = _job(cuda_graph_scopes=("moe_router", "moe_preprocess"))
    _, pre_g, bwd_g = host_ops(g, g.recipe.behaviour, 16, 1)
    assert float(pre_g) == 13 + 1 + 1  # one replay each
    assert float(bwd_g) == 9 + 1 + 0 + 6 + 3 + 8 + 32 * 3
    a = _job(cuda_graph_scopes=("attn",))
    assert float(host_ops(a, a.recipe.behaviour, 16, 1)[1]) == 1 + 14 + 21
    t = _job()
    assert float(host_ops(t, t.recipe.behaviour, 16, 2)[0]) == 8 + 3 + 13 + 32
    f = _job(ep_dispatcher="flex")
    post_f, pre_f, bwd_f = host_ops(f, f.recipe.behaviour, 8, 2)  # no tp gathers with flex
    assert (float(post_f), float(pre_f)) == (5 + 13 + 16, 13 + 14 + 4)
    assert float(bwd_f) == 9 + 6 + 0 + 2 + 3 + 8 + 16 * 3
    s = _job(shared=1)
    assert float(host_ops(s, s.recipe.behaviour, 16, 1)[1]) == 13 + 14 + 21 + 3


def test_exposed_backward_and_overlap() -> None:
    job = _job()
    # 16 experts, bf16: H1 = 53 c, H2 = 48 c, Hb = 129 c
    h1, h2, hb = 53 * C, 48 * C, 129 * C
    fwd, rc = moe_host_exposed(job, job.recipe.behaviour, 16, 1, 1e-4, 2e-4, 1e-3)
    wall = max(C + 3e-4, h1 + 2e-4, h1 + h2)
    assert float(rc) == pytest.approx(wall - 3e-4)
    assert float(fwd) == pytest.approx(wall - 3e-4 + max(hb - 1e-3, 0.0))
    ov = _job(ep_overlap=True)
    both, _ = moe_host_exposed(ov, ov.recipe.behaviour, 16, 1, 1e-4, 2e-4, 1e-3)
    assert float(both) == pytest.approx(max(C + 1.3e-3, h1 + h2 + hb) - 1.3e-3)


def test_host_bound_layer_takes_its_host_time() -> None:
    # a tiny MoE layer (hidden 256, 64 tokens): its GPU work is a few us, so forward +
    # backward take about the host's issue time (53 + 48 + 129) c at 16 local experts
    job = _job(hidden=256, seq=64)
    lf = layer_factors(job, 0, 1, 1, 8, 0, 1, "none", moe=True)
    host = (53 + 48 + 129) * C
    assert host * (1 - 1e-9) <= float(lf.time_s) <= host * 1.1  # equal up to rounding
    assert 0.0 < float(lf.host_s) <= float(lf.compute_s)  # reported apart, inside compute
    # graphing router and preprocess saves (14 + 21 - 2) forward and (6 + 1 - 1) backward ops
    g = _job(hidden=256, seq=64, cuda_graph_scopes=("moe_router", "moe_preprocess"))
    lg = layer_factors(g, 0, 1, 1, 8, 0, 1, "none", moe=True)
    assert float(lf.time_s) - float(lg.time_s) == pytest.approx((33 + 6) * C, rel=0.05)


def test_dense_layers_and_eager_recipes_untouched() -> None:
    job = _job(hidden=256, seq=64)
    dense = layer_factors(job, 0, 1, 1, 1, 0, 1, "none", moe=False)
    graphed = _job(hidden=256, seq=64, cuda_graph_scopes=("attn",))
    assert float(layer_factors(graphed, 0, 1, 1, 1, 0, 1, "none", moe=False).time_s) \
        == float(dense.time_s)
    assert float(dense.host_s) == 0.0
    # eager PyTorch MoE layers keep the EAGER_HOST_* floor, not this term
    eager = _job("pytorch-amp", hidden=256, seq=64)
    e16 = layer_factors(eager, 0, 1, 1, 8, 0, 1, "none", moe=True)
    e4 = layer_factors(eager, 0, 1, 1, 32, 0, 1, "none", moe=True)
    for e in (e16, e4):
        assert float(e.host_s) == 0.0
        assert float(e.time_s) >= EAGER_HOST_S_PER_LAYER
