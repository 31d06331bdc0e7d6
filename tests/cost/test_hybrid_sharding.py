"""Hybrid sharding (`dp_replicate`), by hand.

The toy H100 cluster (toy_cluster.py): NVLink 450 GB/s x NVLINK_EFFICIENCY 0.8 = 360 GB/s and
3 us per hop; the network 50 GB/s per GPU x NETWORK_EFFICIENCY 0.85 = 42.5 GB/s and 8 us per
hop. Ring factors of nccl-tests (reduce-scatter / all-gather (n-1)/n, all-reduce 2(n-1)/n);
the shard group is the inner dp/dp_replicate ranks (torchtitan's mesh [dp_replicate, dp_shard],
Megatron's consecutive distributed-optimizer instances), the replicas the outer ones.
"""

from __future__ import annotations

import pytest
from toy_cluster import h100_cluster

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.sync import dp_sync_factors, fsdp_call_latency
from autoparallel_cp.spec import RECIPES, Job, ModelSpec, MoESpec
from autoparallel_cp.spec.plan import Plan, parse_plan, plan_violations

US = 1e-6
NVL = 360e9  # bytes/s achieved on NVLink
NET = 42.5e9  # bytes/s achieved per GPU on the network


def _model(moe: bool = False) -> ModelSpec:
    return ModelSpec(name="mini", num_layers=4, hidden_size=2048, ffn_hidden_size=8192,
                     num_attention_heads=16, num_kv_heads=16, vocab_size=32000,
                     moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024)
                     if moe else None)


def _job(nodes: int, recipe: str = "megatron-bf16", moe: bool = False) -> Job:
    return Job(model=_model(moe), cluster=h100_cluster(nodes), recipe=RECIPES[recipe],
               seq_len=2048, global_batch=64)


def test_two_nodes_shard_eight_within_a_node_zero1() -> None:
    """2 nodes x 8 GPUs, dp 16 = shard 8 (one node) x replicate 2, ZeRO-1, megatron-bf16
    (fp32 gradient reduction, bf16 weight gather), per parameter on the GPU:
    reduce-scatter over 8 NVLink ranks 7/8 x 4 B / 360 GB/s, then the all-reduce of the
    1/8 share across the 2 replicas, one per node: 2(2-1)/2 x 4/8 B / 42.5 GB/s, then the
    all-gather of the weights over 8 NVLink ranks 7/8 x 2 B / 360 GB/s:
    5.25 B / 360 GB/s + 0.5 B / 42.5 GB/s = 2.6348e-11 s. Fixed latency: 7 x 3 us + 2 x 8 us
    (the all-reduce ring's two phases over one network hop) + 7 x 3 us = 58 us."""
    nd_job = _job(2)
    per_dense, _, z3, fixed = dp_sync_factors(nd_job, 0, 1, 1, 16, 1, 1, rep=2)
    assert float(per_dense) == pytest.approx(5.25 / NVL + 0.5 / NET, rel=1e-12)
    assert float(fixed) == pytest.approx(58.0 * US, rel=1e-12)
    assert float(z3) == 0.0
    # plain sharding over the 16 ranks (hierarchical): 5.25 B over NVLink and
    # 0.25 + 0.125 B over the network; HSDP's gradient all-reduce sends more over the network
    plain, _, _, _ = dp_sync_factors(nd_job, 0, 1, 1, 16, 1, 1)
    assert float(plain) == pytest.approx(5.25 / NVL + 0.375 / NET, rel=1e-12)


def test_replicas_within_one_node_stay_on_nvlink() -> None:
    """1 node, dp 8 = shard 4 x replicate 2: the replicas sit 4 ranks apart in the same node,
    so their all-reduce runs on NVLink: per parameter 3/4 x 4 B (reduce-scatter over 4) +
    2(2-1)/2 x 4/4 B (all-reduce of the 1/4 share) + 3/4 x 2 B (gather) = 5.5 B / 360 GB/s;
    latency 3 x 3 + 2 x 3 + 3 x 3 us = 24 us."""
    per_dense, _, _, fixed = dp_sync_factors(_job(1), 0, 1, 1, 8, 1, 1, rep=2)
    assert float(per_dense) == pytest.approx(5.5 / NVL, rel=1e-12)
    assert float(fixed) == pytest.approx(24.0 * US, rel=1e-12)


def test_torchtitan_zero3_reduces_and_all_reduces_every_micro_batch() -> None:
    """torchtitan FSDP2 (reduce every micro-batch) ZeRO-3 on 2 nodes, shard 8 x replicate 2:
    per dense parameter per micro-batch two bf16 gathers over 8 NVLink ranks (2 x 7/8 x 2 B)
    and the fp32 reduce-scatter (7/8 x 4 B) + replica all-reduce (4/8 B over the network):
    7 B / 360 GB/s + 0.5 B / 42.5 GB/s; nothing of it left for the step. Per FSDP unit and
    micro-batch three ring calls over the node (7 x 3 us each) and one all-reduce over two
    nodes (2 x 8 us): 79 us (plain FSDP over 16 ranks: 3 x (14 x 3 + 8) = 150 us)."""
    job = _job(2, "torchtitan-fsdp")
    per_dense, _, z3, _ = dp_sync_factors(job, 0, 1, 1, 16, 1, 3, rep=2)
    assert float(z3) == pytest.approx(7.0 / NVL + 0.5 / NET, rel=1e-12)
    assert float(per_dense) == 0.0
    mb, step = fsdp_call_latency(job, 0, 1, 1, 16, 3, rep=2)
    assert float(mb) == pytest.approx(79.0 * US, rel=1e-12)
    assert float(step) == 0.0
    mb1, _ = fsdp_call_latency(job, 0, 1, 1, 16, 3)
    assert float(mb1) == pytest.approx(150.0 * US, rel=1e-12)


def test_one_replica_adds_nothing() -> None:
    """dp_replicate = 1 is plain sharding: the replicas' all-reduce is exactly 0."""
    nd = h100_cluster(2).node_groups[0]
    assert float(comm.replica_all_reduce(nd, 16, 1, 1, 1e9)) == 0.0


def test_states_shard_over_the_shard_group_only() -> None:
    """torchtitan's 16 B per parameter (fp32 weights, grads, Adam) under ZeRO-3 on 16 GPUs:
    1 B per parameter plainly, 16/8 = 2 B with shard 8 x replicate 2: weights, gradients and
    optimizer states per GPU double, the activations do not change."""
    job = _job(2, "torchtitan-fsdp")
    base = dict(dp=16, zero=3, mbs=1, num_microbatches=4)
    plain = evaluate(job, Plan(**base)).memory
    hsdp = evaluate(job, Plan(**base, dp_replicate=2)).memory
    for f in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        assert getattr(hsdp, f) == pytest.approx(2.0 * getattr(plain, f), rel=1e-12)
    assert hsdp.activations_bytes == plain.activations_bytes


def test_rules_name_the_broken_factor() -> None:
    job = _job(2)
    assert any("dp % dp_replicate: 16 % 3" in v
               for v in plan_violations(job, Plan(dp=16, zero=1, num_microbatches=4,
                                                  dp_replicate=3)))
    assert any("needs zero >= 1" in v
               for v in plan_violations(job, Plan(dp=16, num_microbatches=4, dp_replicate=2)))
    assert plan_violations(job, Plan(dp=16, zero=1, num_microbatches=4, dp_replicate=2)) == []
    moe = _job(2, moe=True)
    # ep 8 over dp 16: the experts' DP group has 2 ranks, which 4 replicas cannot divide
    bad = Plan(dp=16, ep=8, zero=1, num_microbatches=4, dp_replicate=4)
    assert any("expert-DP group % dp_replicate: 2 % 4" in v for v in plan_violations(moe, bad))


def test_neutral_value_keeps_old_plan_strings() -> None:
    job = _job(2)
    old = parse_plan("zero=1,mbs=1", job)
    assert old.dp_replicate == 1 and "dp_replicate" not in old.short()
    new = parse_plan("zero=1,mbs=1,dp_replicate=2", job)
    assert "dp_replicate=2" in new.short()
    assert parse_plan(new.short(), job) == new
    assert new.key() != old.key()
    assert (new.dp_shard, new.state_shard) == (8, 8)
