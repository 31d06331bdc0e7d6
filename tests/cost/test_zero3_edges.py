"""ZeRO-3 gathers and reduces the embedding and the LM head in every micro-batch, exposed.

FSDP's root unit (OLMo-core model.py:362-368, torchtitan apply_fsdp) holds the embedding, the
final norm and the LM head: all-gathered once in the root's pre-forward (not resharded after
forward, torch _fsdp_state.py:203-207) and reduce-scattered in the final callback, which the
compute stream waits for (_fsdp_state.py:395-431). Hand-derived on dp = 8 ranks inside one
NVLink node (ring: (n-1)/n of the bytes, (n-1) hops of latency per call).
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost import comm
from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.embedding_head import edge_factors
from autoparallel_cp.cost.steptime import stage_times
from autoparallel_cp.cost.timeline import zero3_gather_s
from autoparallel_cp.cost.zero3_edges import zero3_edge_s
from autoparallel_cp.spec import (
    RECIPES,
    ClusterSpec,
    GPUSpec,
    Job,
    LinkSpec,
    ModelSpec,
    NodeGroup,
)
from autoparallel_cp.spec.plan import Plan

NV = 450e9 * comm.NVLINK_EFFICIENCY
LAT = 3e-6
V, H = 100352, 4096


def _job(recipe: str = "torchtitan-fsdp", nodes: int = 1) -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    nd = NodeGroup(name="n", gpu=gpu, gpus_per_node=8, num_nodes=nodes,
                   intra_node=LinkSpec(bandwidth_gbps=450, latency_us=3.0),
                   inter_node=LinkSpec(bandwidth_gbps=50, latency_us=8.0))
    m = ModelSpec(name="olmo7b-like", num_layers=4, hidden_size=H, ffn_hidden_size=11008,
                  num_attention_heads=32, num_kv_heads=32, vocab_size=V)
    return Job(model=m, cluster=ClusterSpec(name="c", node_groups=[nd]),
               recipe=RECIPES[recipe], seq_len=4096, global_batch=64)


def test_head_gather_and_fp32_reduce_per_microbatch() -> None:
    """LM head V·H weights per GPU: a bf16 gather (2 B) and an fp32 reduce-scatter (4 B), each
    (n-1)/n of the bytes over NVLink plus 7 hops of latency: (2 + 4)·V·H·7/8 / NV + 2·7·LAT."""
    job = _job()
    p = float(V * H)
    want = (2.0 + 4.0) * p * 7 / 8 / NV + 2 * 7 * LAT
    assert float(zero3_edge_s(job, 0, p, 1, 1, 8, 3)) == pytest.approx(want, rel=1e-9)


def test_no_term_below_zero3_or_without_sharding() -> None:
    job, p = _job(), float(V * H)
    for z in (0, 1, 2):
        assert float(zero3_edge_s(job, 0, p, 1, 1, 8, z)) == 0.0
    assert float(zero3_edge_s(job, 0, p, 1, 1, 1, 3)) == 0.0  # one rank: nothing to gather
    assert float(zero3_edge_s(job, 0, 0.0, 1, 1, 8, 3)) == 0.0  # a tied head has no weights


def test_step_reduction_keeps_only_the_gather() -> None:
    """zero3_reduce "step": the reduction stays in the step's DP sync; per micro-batch only
    the bf16 gather, 2·V·H·7/8 / NV + 7·LAT."""
    base = RECIPES["torchtitan-fsdp"]
    rec = base.with_behaviour(zero3_reduce="step")
    job = _job().model_copy(update={"recipe": rec})
    p = float(V * H)
    want = 2.0 * p * 7 / 8 / NV + 7 * LAT
    assert float(zero3_edge_s(job, 0, p, 1, 1, 8, 3)) == pytest.approx(want, rel=1e-9)


def test_stage_time_carries_both_edges_once_per_microbatch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One stage (pp 1): its ZeRO-3 time is the layers' term plus exactly the embedding's and
    the head's, and the timeline's pre-overlap gather total grows by the same."""
    job = _job()
    plan = Plan(tp=1, pp=1, dp=8, zero=3, mbs=1, num_microbatches=8, recompute="none")
    ef = edge_factors(job, 0, 1, 1, 0, 1)
    edge = sum(float(zero3_edge_s(job, 0, float(x), 1, 1, 8, 3))
               for x in (ef.emb_params, ef.head_params))
    assert edge > 0.0
    with_edges = stage_times(job, plan)[0].zero3_s
    gathers = zero3_gather_s(job, plan)[0]
    assert gathers >= with_edges - 1e-12  # the exposed part never exceeds the whole
    monkeypatch.setattr(F, "zero3_edge_s", lambda *a, **k: 0.0)
    assert with_edges - stage_times(job, plan)[0].zero3_s == pytest.approx(edge, rel=1e-9)
    assert gathers - zero3_gather_s(job, plan)[0] == pytest.approx(edge, rel=1e-9)
    assert stage_times(job, plan.model_copy(update={"zero": 1}))[0].zero3_s == 0.0


def test_gathered_edges_held_in_memory_on_their_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root unit's unsharded bf16 weights, 2 B per edge parameter, are held on the first
    (embedding) and last (head) stage at ZeRO-3 only: pp 2 puts V·H·2 B on each end."""
    from autoparallel_cp.cost.memory import stage_memory
    from autoparallel_cp.cost.zero3_edges import zero3_edge_bytes

    assert float(zero3_edge_bytes(10.0, 3)) == 20.0
    assert float(zero3_edge_bytes(10.0, 2)) == 0.0
    job = _job(nodes=2)
    plan = Plan(tp=1, pp=2, dp=8, zero=3, mbs=1, num_microbatches=8, recompute="none")
    ef = edge_factors(job, 0, 1, 1, 0, 1)
    with_edges = [m.other_bytes for m in stage_memory(job, plan)]
    monkeypatch.setattr(F, "zero3_edge_bytes", lambda *a, **k: 0.0)
    without = [m.other_bytes for m in stage_memory(job, plan)]
    assert with_edges[0] - without[0] == pytest.approx(2.0 * float(ef.emb_params), rel=1e-12)
    assert with_edges[1] - without[1] == pytest.approx(2.0 * float(ef.head_params), rel=1e-12)
