"""A V's empty rank 0 with a dense prefix (search/empty_rank.py, issue 31 "one space"): the
free V family of an MoE model with `first_k_dense_layers` > 0 walks rank 0 from 0 layers, the
prefix then on rank 1 as the cost model lays it out (spec/splits.py `prefix_counts`, cost/
memory.py `stage_layer_kinds`); the enumerator, the count and CP-SAT walk the same splits;
every bound stays below every key's exact best (hypothesis); CP-SAT equals the enumerator;
a large vocabulary on few layers makes the empty rank 0 the best plan, its step evaluate's."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_cpsat_partition import _check_key_bound_of
from test_empty_rank import check_v_space
from test_replay_free_multi import _compare as _compare_multi
from test_replay_free_multi import solve_pinned
from test_replay_search import _compare_exact
from test_solver_vs_enumerate import _assert_master_bounds, _key, _mini, _mixed_small, _ranked

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_layer_kinds
from autoparallel_cp.search import cpsat_partition
from autoparallel_cp.search.empty_rank import empty_first
from autoparallel_cp.search.enumerate_axes import partition_array, partitions
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.model import ModelSpec
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.splits import prefix_counts

V = ("zbv", "dualpipev")


def _moe(layers: int, k: int, vocab: int = 32000) -> ModelSpec:
    m = _mini(True, layers)
    assert m.moe is not None
    return m.model_copy(update={"vocab_size": vocab, "moe": m.moe.model_copy(
        update={"first_k_dense_layers": k})})


def _job(layers: int, k: int, vocab: int = 128000, gpus: int = 4, seq: int = 4096,
         batch: int = 16) -> Job:
    return Job(model=_moe(layers, k, vocab), cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
               seq_len=seq, global_batch=batch)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(0, 6), per=st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_prefix_counts_are_the_cost_models(k: int, per: list[int]) -> None:
    """spec/splits.py `prefix_counts` == the dense layers cost/memory.py gives each stage."""
    L = sum(per)
    if max(k, 1) > L:
        return
    job = Job(model=_moe(L, k), cluster=load_cluster("dgx-a100-40g").take_gpus(8),
              seq_len=4096, global_batch=16)
    plan = Plan(pp=len(per), stage_layers=tuple(per))
    assert prefix_counts(k, tuple(per)) == tuple(d for d, _, _, _ in
                                                 stage_layer_kinds(job, plan))


@pytest.mark.parametrize("sched", V)
def test_the_free_v_family_of_a_prefix_model(sched: str) -> None:
    """8 layers on pp 4 (multiples of 2): with a 1- or 2-layer prefix rank 0 holds 0 or >= 2
    layers; with 3, rank 0 holds 0 (rank 1 then >= 4) or >= 4; the generator, the array and
    the count agree; the other schedules keep the prefix on a non-empty first stage."""
    want = {1: [(0, 2, 2, 4), (0, 2, 4, 2), (0, 4, 2, 2), (2, 2, 2, 2)],
            3: [(0, 4, 2, 2)]}
    for k, rows in want.items():
        sp = SearchSpace.for_job(_job(8, k), fix=f"schedule={sched}", max_pp=4)
        assert empty_first(sp) and sp.first_stage_min_units(2) == 0
        assert list(partitions(sp, 4, 2)) == rows == [
            tuple(r) for r in partition_array(sp, 4, 2)[0].tolist()]
        assert sp.num_partitions(4, 2) == len(rows)
        # pp 2: (0, 8), then rank 0 from the prefix's least count
        two = list(partitions(sp, 2, 2))
        assert two[0] == (0, 8) and all(p[0] == 0 or p[0] >= k for p in two)
        assert len(two) == sp.num_partitions(2, 2) == len(partition_array(sp, 2, 2)[0])
    sp = SearchSpace.for_job(_job(12, 3), fix=f"schedule={sched}", max_pp=4)
    rows = list(partitions(sp, 4, 2))
    assert len(rows) == sp.num_partitions(4, 2) == len(partition_array(sp, 4, 2)[0])
    assert all((p[0] == 0 and p[1] >= 4) or p[0] >= 4 for p in rows)
    assert any(p[0] == 0 for p in rows) and any(p[0] > 0 for p in rows)
    o = SearchSpace.for_job(_job(8, 3), fix="schedule=zb-h1", max_pp=4)
    assert not empty_first(o) and o.first_stage_min_units(1) == 3


def test_the_proof_line_and_outside_with_a_prefix() -> None:
    """The proof line names the empty rank 0 and where the prefix sits, no exception; a split
    whose first stage holding layers holds less than the prefix is outside, and says so."""
    sp = SearchSpace.for_job(_job(8, 3), fix="schedule=zbv", max_pp=4)
    line = space_line(proof_space(sp))
    assert "rank 0 (the embedding and the head) from 0 layers" in line
    assert "dense prefix (3 layers) whole on the first rank holding layers" in line
    assert "it holds the dense prefix" not in line
    best = enumerate_plans(_job(8, 3), sp, top_k=1).plans[0].plan
    inside = best.model_copy(update={"pp": 4, "stage_layers": (0, 4, 2, 2),
                                     "chunk_layers": None})
    assert outside(sp, inside) is None
    short = inside.model_copy(update={"stage_layers": (0, 2, 2, 4)})
    assert "dense prefix" in (outside(sp, short) or "")


def test_a_large_vocabulary_empties_rank_0_of_a_prefix_model() -> None:
    """A 2-layer dense prefix, 6 layers on pp 4 at a 128k vocabulary: the best plan leaves
    rank 0 empty (the prefix on rank 1), its step is evaluate's, and CP-SAT finds the
    enumerator's top 3."""
    job = _job(6, 2)
    sp = SearchSpace.for_job(job, fix="schedule=zbv,pp=4", max_pp=4, max_mbs=2)
    assert sp.free_ok(4, 2) and sp.num_partitions(4, 2) == 1  # (0, 2, 2, 2) only
    best = enumerate_plans(job, sp, top_k=1).plans[0]
    assert best.plan.layers_per_stage(6) == (0, 2, 2, 2)
    ev = evaluate(job, best.plan)
    assert ev.fits and ev.time.step_s == pytest.approx(best.time.step_s, rel=1e-12)
    t = build_tables(sp)
    pc = plan_cost(t, best.plan)
    assert pc.step_s == pytest.approx(ev.time.step_s, rel=1e-12)
    _compare_exact(job, sp, 3)
    # a free pp: the empty rank 0 wins against every split that keeps the prefix on rank 0
    job = _job(8, 2)
    sp = SearchSpace.for_job(job, fix="schedule=zbv,tp=1,cp=1", max_pp=4, max_mbs=1)
    ranked = _ranked(sp)
    assert ranked[0][1].layers_per_stage(8)[0] == 0
    _compare_exact(job, sp, 3)


def test_the_key_bounds_hold_where_rank_0_is_empty() -> None:
    """The per-key bound (uncoupled and coupled: position 0 with no prefix at 0 layers,
    position 1 the least of holding it or not) stays below every key's exact best, among
    them keys whose best leaves rank 0 empty."""
    job = _job(12, 3, gpus=8)
    sp = SearchSpace.for_job(job, fix="schedule=zbv,tp=1,cp=1", max_pp=4, max_mbs=1,
                             zero=(1, 3))
    assert _check_key_bound_of(sp) > 0
    ranked = _ranked(sp)
    empty = [(c, p) for c, p in ranked if p.layers_per_stage(12)[0] == 0]
    assert empty
    t = build_tables(sp)
    assert all(0.0 < key_bound(t, _key(p)) <= c for c, p in empty)
    _assert_master_bounds(job, sp, 1)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@example(sched="zbv", layers=6, k=2, vocab=128000, gpus=8, batch=16, seq=4096, zero=(0, 1))
@example(sched="dualpipev", layers=8, k=3, vocab=256000, gpus=4, batch=16, seq=8192,
         zero=(1, 3))
@given(sched=st.sampled_from(V), layers=st.sampled_from([4, 6, 8]), k=st.sampled_from([1, 2, 3]),
       vocab=st.sampled_from([32000, 128000, 256000]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16]), seq=st.sampled_from([2048, 8192]),
       zero=st.sampled_from([(0, 1), (1, 3)]))
def test_bounds_and_cpsat_with_a_prefix_and_empty_first_ranks(
        sched: str, layers: int, k: int, vocab: int, gpus: int, batch: int, seq: int,
        zero: tuple[int, ...]) -> None:
    """Every key's per-key bound (uncoupled and coupled) and the master's <= the enumerator's
    exact best of the key, and CP-SAT's top k == the enumerator's, on V spaces of a model
    with a dense prefix whose free splits include rank 0 empty."""
    check_v_space(_job(layers, k, vocab, gpus, seq, batch), sched, zero)


@pytest.mark.parametrize("sched", V)
def test_two_groups_bound_every_split_and_placement_with_a_prefix(sched: str) -> None:
    """On two node groups (the prefix on rank 0 or 1, each on its group: cpsat_prefix.py
    `on_groups`), every free split and placement pinned in a key's model: objective <= the
    exact step; and CP-SAT's top 3 == the enumerator's."""
    job = Job(model=_moe(8, 2), cluster=_mixed_small(), seq_len=4096, global_batch=32)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched},tp=2,cp=1,pp=4,mbs=1,zero=1",
                             max_pp=4)
    t = build_tables(sp)
    key = build_key_table(t).key(0)
    splits = list(partitions(sp, 4, 2))
    assert any(p[0] == 0 for p in splits)
    checked = 0
    for split, q in itertools.product(splits, sorted(set(itertools.permutations(
            (0, 0, 1, 1))))):
        pm = cpsat_partition.build_partition(t, key)
        assert pm is not None and pm.y is not None
        s = solve_pinned(pm.model, pm.layers, pm.y, split, q, must_fit=False)
        if s is None:
            continue
        plan = pm.read_plan(s, False)
        assert plan.stage_groups == q and plan.stage_layers == split
        assert s.objective_value * pm.scale_s <= plan_cost(t, plan).step_s
        checked += 1
    assert checked >= 12
    _compare_multi(job, SearchSpace.for_job(job, fix=f"schedule={sched},pp=4,tp=2", max_pp=4,
                                            max_mbs=2, zero=(1,)), 3)


def test_the_host_bound_counts_an_empty_rank_0() -> None:
    """offload_axis.py `stage_layers_bound` (the largest stage `host_ok` charges): with rank 0
    possibly empty a free split's largest stage holds L - (pp - 2)·vpp layers, 12 on pp 4:
    8, the split 0:8:2:2 (it said L - (pp - 1)·vpp = 6)."""
    from autoparallel_cp.search.offload_axis import stage_layers_bound

    sp = SearchSpace.for_job(_job(12, 2), fix="schedule=zbv", max_pp=4)
    assert max(max(p) for p in partitions(sp, 4, 2)) == 8 == stage_layers_bound(sp, 4)
    o = SearchSpace.for_job(_job(12, 2), fix="schedule=zb-h1", max_pp=4)
    assert max(max(p) for p in partitions(o, 4, 1)) == 9 == stage_layers_bound(o, 4)
