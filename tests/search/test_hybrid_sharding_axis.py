"""Hybrid sharding as a searched axis (issue 28.3): without a pin, the frameworks that run HSDP
search dp_replicate 1 and the replicas of a shard group of whole nodes
(`spec.hybrid_sharding.node_shard_replicas`), a variant space per value like the expert-TP
sizes. CP-SAT's top k equals the enumerator's, the master's bound stays below every key's
exact best, the tables' cost equals `evaluate`'s, no single change `explain` scores inside the
space beats a proven optimum, and HSDP wins where the hand figures say it should."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import _assert_master_bounds, _compare_tol, _mini, _ranked_or_raise

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.search.neighbours import neighbours, single_changes
from autoparallel_cp.search.solve import solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import RECIPES, Job, ModelSpec
from autoparallel_cp.spec.hybrid_sharding import node_shard_replicas
from autoparallel_cp.spec.loaders import load_cluster

US = 1e-6


def _job(moe: bool, layers: int, gpus: int, recipe: str, seq: int = 2048,
         batch: int = 32) -> Job:
    return Job(model=_mini(moe, layers), cluster=load_cluster("dgx-h100").take_gpus(gpus),
               recipe=RECIPES[recipe], seq_len=seq, global_batch=batch)


def test_node_shard_replicas_by_hand() -> None:
    """8 GPUs a node: tp 1 -> shard 8 (one node), tp 2 cp 2 -> shard 2 (one node), tp 8 ->
    two nodes of one rank each (shard 2), tp 4 cp 2 -> cp shards a node (dp_shard 1); a dp
    the shard group does not divide, or a single replica, has no HSDP layout (1)."""
    assert node_shard_replicas(1, 1, 64, 8) == 8
    assert node_shard_replicas(2, 2, 16, 8) == 8
    assert node_shard_replicas(8, 1, 16, 8) == 8
    assert node_shard_replicas(4, 2, 16, 8) == 16
    assert node_shard_replicas(1, 1, 8, 8) == 1  # one node: one replica
    assert node_shard_replicas(1, 1, 12, 8) == 1  # 8 does not divide 12


def test_the_axis_follows_the_frameworks() -> None:
    """Megatron and torchtitan search it; DeepSpeed (MiCS removed) does not; a pin is one
    value; the proof names the values."""
    job = _job(False, 4, 32, "megatron-bf16")
    space = SearchSpace.for_job(job)
    assert space.rep_axis[0] == 1 and len(space.rep_axis) > 1
    assert space.describe()["dp_replicate"] == list(space.rep_axis)
    assert "dp_replicate 1," in space_line(proof_space(space))
    tt = SearchSpace.for_job(_job(False, 4, 32, "torchtitan-fsdp"))
    assert len(tt.rep_axis) > 1
    assert SearchSpace.for_job(_job(False, 4, 32, "deepspeed")).rep_axis == (1,)
    assert SearchSpace.for_job(job, hybrid=False).rep_axis == (1,)
    assert SearchSpace.for_job(job, fix="dp_replicate=2").rep_axis == (2,)
    assert SearchSpace.for_job(job, fix="zero=0").rep_axis == (1,)  # nothing sharded
    assert SearchSpace.for_job(job, fix="zero=1").rep_axis == (1,)  # no hybrid FSDP


def test_size_counts_each_key_once_per_replicas() -> None:
    """The axis adds, per key with zero >= 2 whose dp takes a node shard group, exactly the
    plans of the R = 1 key: the size is the plain size plus those keys' plans."""
    job = _job(False, 4, 32, "megatron-bf16")
    kw = dict(max_pp=2, max_vpp=1, max_mbs=2, partial_recompute=False,
              fix="optimizer_offload=0")  # one offload share (search/offload_axis.py)
    plain = SearchSpace.for_job(job, hybrid=False, **kw)  # type: ignore[arg-type]
    both = SearchSpace.for_job(job, **kw)  # type: ignore[arg-type]
    extra = 0
    for v in plain.schedule_variants():  # the default and zero-bubble schedules' sub-spaces
        for d in v.degrees():
            if node_shard_replicas(d.tp, d.cp, d.dp, 8) > 1:
                sps = [s for s in v.sp if v.sp_ok(d.tp, s)]
                extra += len(sps) * sum(1 for z in v.zero if z >= 2) * len(v.recompute) \
                    * v.num_partitions(d.pp, d.vpp)
    assert extra > 0 and both.size() == plain.size() + extra


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([4, 6]), gpus=st.sampled_from([16, 32]),
       recipe=st.sampled_from(["torchtitan-fsdp", "megatron-bf16"]))
def test_axis_matches_enumeration(moe: bool, layers: int, gpus: int, recipe: str) -> None:
    """Two or four 8-GPU nodes, the replicas' axis searched: CP-SAT's top k equals the
    enumerator's (the tie-break by `Plan.key()` includes dp_replicate)."""
    job = _job(moe, layers, gpus, recipe)
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=2, max_mbs=2, zero=(0, 1, 2, 3))
    assert len(space.rep_axis) > 1
    res = _compare_tol(job, space, 6)
    for ev in res.plans:
        p = ev.plan
        if p.dp_replicate > 1:
            assert p.zero >= 2 and p.dp_replicate == node_shard_replicas(p.tp, p.cp, p.dp, 8)


def test_master_bound_holds_with_the_axis() -> None:
    """LB(key) <= the enumerator's best of every key, HSDP plans included (the R > 1
    variants' tables are masked to +inf where R is not the key's: cpsat_master.py)."""
    job = _job(False, 6, 32, "torchtitan-fsdp")
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 2, 3))
    assert len(space.rep_axis) > 1
    _assert_master_bounds(job, space, 5)


def test_tables_cost_equals_evaluate_on_the_axis() -> None:
    """Every ranked plan of a MoE space with the axis, R > 1 ones among them: the tables of
    the plan's variant give `evaluate`'s step time."""
    job = _job(True, 4, 32, "megatron-bf16")
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=1, max_mbs=2, partial_recompute=False)
    ranked = _ranked_or_raise(job, space)
    reps = {p.dp_replicate for _, p in ranked}
    assert 1 in reps and len(reps) > 1
    t = build_tables(space)
    for cost, plan in ranked[::5]:
        ev = evaluate(job, plan)
        assert cost == pytest.approx(ev.time.step_s, rel=1e-9)
        assert plan_cost(t, plan).step_s == pytest.approx(ev.time.step_s, rel=1e-9)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(moe=st.booleans(), layers=st.sampled_from([4, 6, 9]), gpus=st.sampled_from([16, 32]),
       batch=st.sampled_from([32, 64]), recipe=st.sampled_from(["torchtitan-fsdp",
                                                                 "megatron-bf16"]))
def test_no_neighbour_inside_the_space_beats_a_proven_optimum(
        moe: bool, layers: int, gpus: int, batch: int, recipe: str) -> None:
    """`explain`'s single changes, dp_replicate's among them (to and from the node shard
    group's replicas), never beat a proven optimum of the space they lie in."""
    job = _job(moe, layers, gpus, recipe, batch=batch)
    sp = SearchSpace.for_job(job, max_pp=4, max_mbs=2)
    assert len(sp.rep_axis) > 1
    try:
        res = solve(job, sp, top_k=1, time_limit=60)
    except InfeasibleError:
        assume(False)
        return
    assert res.status == "optimal"
    best = res.plans[0]
    inside = [p for _, p in neighbours(job, best.plan) if outside(sp, p) is None]
    assert inside
    if best.plan.zero >= 2 and node_shard_replicas(best.plan.tp, best.plan.cp,
                                                   best.plan.dp, 8) > 1:
        # the axis is covered: a dp_replicate neighbour lies in the space
        assert any(p.dp_replicate != best.plan.dp_replicate for p in inside)
    for ch in single_changes(job, best.plan, best.to_json()):
        assert outside(sp, ch.plan) is not None, (ch.change, ch.step_s, best.time.step_s)


def _latency_bound() -> Job:
    """Two H100 nodes, torchtitan FSDP2 ZeRO-3, a 2048-wide 4-layer model at 512 tokens: the
    per-layer gathers outlast the layer's compute, so every FSDP call's latency is exposed; a
    256-token vocabulary keeps the root unit's embedding and head (cost/zero3_edges.py) small."""
    model = ModelSpec(name="mini", num_layers=4, hidden_size=2048, ffn_hidden_size=8192,
                      num_attention_heads=16, num_kv_heads=16, vocab_size=256)
    return Job(model=model, cluster=load_cluster("dgx-h100").take_gpus(16),
               recipe=RECIPES["torchtitan-fsdp"], seq_len=512, global_batch=64)


def test_hsdp_wins_where_the_network_latency_dominates() -> None:
    """ZeRO-3 over dp 16 on two nodes. Per FSDP unit and micro-batch, plain sharding makes
    three ring calls over 16 ranks (2 gathers, 1 reduce-scatter: 3 x (14 NVLink hops x
    3 us + 1 network hop x 8 us) = 150 us), HSDP shard 8 x replicate 2 three over the node
    (3 x 7 x 3 us) and one all-reduce over the two nodes (2 x 8 us) = 79 us; the bytes are the
    same (7 B / NVLink + 0.5 B / network per parameter both ways, tests/cost/
    test_hybrid_sharding.py). With the gathers exposed, the DP time falls by m x (L + 1)
    x 71 us (each of the L layers, plus the first layer's gather before compute) = 4 x 5 x
    71 us = 1.42 ms, while the optimizer, on 1/8 instead of 1/16 of the parameters, takes
    exactly twice as long (0.79 ms more). HSDP is faster, and the search, with the axis,
    finds it as the optimum."""
    job = _latency_bound()
    base = dict(dp=16, zero=3, mbs=1, num_microbatches=4)
    from autoparallel_cp.spec.plan import Plan

    plain = evaluate(job, Plan(**base)).time
    hsdp = evaluate(job, Plan(**base, dp_replicate=2)).time
    # the root unit's embedding and LM head (cost/zero3_edges.py) are charged by their own
    # hand-derived tests (tests/cost/test_zero3_edges.py); here their per-micro-batch terms
    # are taken out of both sides
    from autoparallel_cp.cost.zero3_edges import zero3_edge_s
    from autoparallel_cp.spec.params import count_params

    pc = count_params(job.model)

    def edges(rep: int) -> float:
        return 4 * sum(float(zero3_edge_s(job, 0, p_, 1, 1, 16, 3, rep))
                       for p_ in (pc.embedding, pc.lm_head))

    assert (plain.dp_comm_s - edges(1)) - (hsdp.dp_comm_s - edges(2)) == pytest.approx(
        4 * 5 * 71 * US, rel=2e-3)
    assert hsdp.optimizer_s == pytest.approx(2.0 * plain.optimizer_s, rel=1e-12)
    assert hsdp.step_s < plain.step_s
    space = SearchSpace.for_job(job, fix="tp=1,pp=1,cp=1,zero=3,mbs=1,recompute=none")
    assert space.rep_axis == (1, 2)
    # one key (every axis pinned): its best plan is the best over its replicas variants
    res = solve(job, space, top_k=1, time_limit=60)
    assert res.status == "optimal"
    top = res.plans[0]
    assert top.plan.dp_replicate == 2 and top.time.step_s == pytest.approx(hsdp.step_s,
                                                                           rel=1e-9)
    plain_only = solve(job, SearchSpace.for_job(job, fix="tp=1,pp=1,cp=1,zero=3,mbs=1,"
                                                "recompute=none", hybrid=False),
                       top_k=1, time_limit=60)
    assert plain_only.plans[0].plan.dp_replicate == 1
    assert plain_only.plans[0].time.step_s == pytest.approx(plain.step_s, rel=1e-9)
