"""Free per-rank layer counts under ZBV / DualPipeV on several node groups (issue 31, "one
space"; search/cpsat_replay.py, "Several node groups"): the stage placement is a choice of
the per-key model (its group selectors), each rank's time read from its group's tables, so
the model's objective is <= the exact step of every (split, placement), CP-SAT's top k equals
the enumerator's on random two-group spaces (pp 2 and 4), and an uneven free split that gives
the faster group's rank more layers beats every named layout and is found."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from test_solver_vs_enumerate import _mini, _mixed_small

from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.search import cpsat_partition
from autoparallel_cp.search.empty_rank import empty_first
from autoparallel_cp.search.enumerate import Degrees
from autoparallel_cp.search.enumerate_axes import partition_array, placement_array
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.model_scan import _best_of_row
from autoparallel_cp.search.replay_axis import free_searched, scored_free
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, key_variants, plan_cost
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

V = ("zbv", "dualpipev")


def _mixed_job(layers: int, moe: bool = False, seq: int = 4096, batch: int = 32) -> Job:
    """One H100 node (group 0) and one A100 node (group 1), 16 GPUs."""
    return Job(model=_mini(moe, layers), cluster=_mixed_small(), seq_len=seq,
               global_batch=batch)


def solve_pinned(model: Any, layers: Any, groups: Any, row: Any, q: Any,
                 must_fit: bool = True) -> Any:
    """Pin a per-key model's layer counts to `row` and its stage placement selectors to `q`,
    solve it on one worker and check a plan stays (OPTIMAL); the solver, for its objective
    (None where no plan stays and `must_fit` is off)."""
    for x, n in zip(layers, row, strict=True):
        model.add(x == int(n))
    for yr, g in zip(groups, q, strict=True):
        model.add(yr[g] == 1)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    status = s.solve(model)
    if not must_fit and status != cp_model.OPTIMAL:
        return None
    assert status == cp_model.OPTIMAL
    return s


def _ident(p: Plan, layers: int) -> tuple[object, ...]:
    """A plan's identity up to how its split is written (a named layout's plan carries its
    `chunk_layers`, with or without the derived `stage_layers`)."""
    return (p.key()[:10], p.recompute_layers, p.layers_per_stage(layers), p.stage_groups,
            p.chunk_layers, p.schedule)


def _compare(job: Job, space: SearchSpace, k: int) -> None:
    """CP-SAT's top k equals the enumerator's: the same exact costs, plans and placements."""
    try:
        b = enumerate_plans(job, space, top_k=k)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve(job, space, top_k=k, time_limit=120)
        return
    a = solve(job, space, top_k=k, time_limit=120)
    assert a.status == "optimal" and a.error_bound_s == 0.0
    L = job.model.num_layers
    assert [(c, _ident(p, L)) for c, p in a.stats["ranked"]] == [
        (c, _ident(p, L)) for c, p in b.stats["ranked"]]


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@example(sched="zbv", moe=False, layers=12, pp=4, tp=2, seq=2048)
@example(sched="dualpipev", moe=True, layers=6, pp=2, tp=1, seq=4096)  # scored by the model
@example(sched="zbv", moe=False, layers=6, pp=4, tp=1, seq=2048)  # rank 0 empty: 0:2:2:2
@given(sched=st.sampled_from(V), moe=st.booleans(), layers=st.sampled_from([6, 8, 10, 12]),
       pp=st.sampled_from([2, 4]), tp=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([2048, 8192]))
def test_free_v_on_two_groups_matches_enumeration(sched: str, moe: bool, layers: int, pp: int,
                                                  tp: int, seq: int) -> None:
    job = _mixed_job(layers, moe, seq)
    try:
        space = SearchSpace.for_job(job, fix=f"schedule={sched},pp={pp},tp={tp}", max_pp=4,
                                    max_mbs=2, zero=(1,))
    except UserError:
        return  # no plan of this pin (exit 2)
    if space.num_degree_combinations() == 0:
        return
    assert space.heterogeneous and free_searched(space)
    # each rank two equal chunks >= 1, but rank 0 may be empty without a dense prefix
    # (search/empty_rank.py: 6 layers on pp 4 is the Zero Bubble fork's 2·pp - 2 layout)
    assert space.free_ok(pp, 2) == (layers >= 2 * pp - (2 if empty_first(space) else 0))
    _compare(job, space, 3)


@pytest.mark.parametrize("sched", V)
def test_the_model_objective_bounds_every_split_and_placement(sched: str) -> None:
    """Every free split and every stage placement of a key pinned in its model: objective <=
    the exact step time (the placement's rank times from its groups' tables), and within
    the error bound once the cuts hold the plan's own longest path."""
    job = _mixed_job(12)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched},tp=2,cp=1,pp=4,mbs=1,zero=1",
                             max_pp=4)
    t = build_tables(sp)
    kt = build_key_table(t)
    checked, groups_seen = 0, set()
    for i in range(min(len(kt.lb), 3)):
        key = kt.key(i)
        places = sorted({q for q in itertools.permutations((0, 0, 1, 1))})
        assert len(places) == 6
        for cut, q in itertools.product(itertools.combinations(range(1, 6), 3), places):
            units = [b - a for a, b in zip((0, *cut), (*cut, 6), strict=True)]
            pm = cpsat_partition.build_partition(t, key)
            assert pm is not None and pm.y is not None
            s = solve_pinned(pm.model, pm.layers, pm.y, [2 * u for u in units], q,
                             must_fit=False)
            if s is None:
                continue
            plan = pm.read_plan(s, False)
            assert plan.stage_groups == q
            pc = plan_cost(t, plan)
            assert s.objective_value * pm.scale_s <= pc.step_s
            pm.replay.add(pm.replay.path_at(pc.stage_time_s))
            assert s.solve(pm.model) == cp_model.OPTIMAL
            assert s.objective_value * pm.scale_s <= pc.step_s
            assert pc.step_s - s.objective_value * pm.scale_s <= pm.error_bound_s
            checked += 1
            groups_seen.add(q)
    assert checked >= 60 and len(groups_seen) == 6


def test_the_scored_model_objective_bounds_every_split_and_placement() -> None:
    """A DualPipeV hiding EP all-to-all (each split scored by the cost model) on two groups:
    objective <= the exact best of every (split, placement) over its recompute counts."""
    job = _mixed_job(8, moe=True, batch=64)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipev,tp=1,cp=1,pp=2,mbs=1,zero=1",
                             max_pp=4)
    assert scored_free(sp)
    t = build_tables(sp)
    kt = build_key_table(t)
    checked = 0
    for i in range(len(kt.lb)):
        key = kt.key(i)
        d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
        for v in key_variants(t, key):
            parts, _ = partition_array(v.space, key.pp, key.vpp)
            _, place_objs = placement_array(v.space, v, d)
            for row, q in itertools.product(parts, place_objs):
                got = _best_of_row(v, key, d, row, None, [q])
                if got is None:
                    continue
                pm = cpsat_partition.build_partition(v, key)
                assert pm is not None and pm.y is not None and q is not None
                s = solve_pinned(pm.model, pm.layers, pm.y, row, q)  # a fitting plan stays in
                assert s.objective_value * pm.scale_s <= got[0] * (1 + 1e-12)
                checked += 1
    assert checked >= 20


def test_an_uneven_free_split_on_two_groups_beats_every_named_layout() -> None:
    """12 layers at pp 2: an H100 rank's layer takes about 1.0 ms, an A100 rank's about
    1.9 ms (plan_cost's rank times: (8, 4) on groups (0, 1) gives 10.2 and 8.1 ms, (6, 6)
    8.1 and 12.0 ms), so the best ZBV plan gives the H100 rank (group 0, which also holds
    the embedding and the head) twice the A100 rank's layers, (8, 4): 81.7 ms against 83.2
    ms for the best named layout (7, 5). Before the free family was searched on several
    groups the search returned that named layout."""
    job = _mixed_job(12)
    sp = SearchSpace.for_job(job, fix="schedule=zbv,tp=4,pp=2", max_pp=4, max_mbs=2,
                             zero=(1,))
    best = solve(job, sp, top_k=1, time_limit=60).plans[0]
    assert best.plan.stage_layers == (8, 4) and best.plan.stage_groups == (0, 1)
    assert best.plan.chunk_layers is None
    assert job.cluster.node_groups[0].gpu.name.startswith("H100")
    t = build_tables(sp)
    fast = plan_cost(t, best.plan).stage_time_s
    even = plan_cost(t, best.plan.model_copy(update={"stage_layers": (6, 6)})).stage_time_s
    assert (fast[0] - even[0]) / 2 < (even[1] - fast[1]) / 2  # per layer: H100 < A100
    named = SearchSpace.for_job(job, fix="schedule=zbv,tp=4,pp=2", max_pp=4, max_mbs=2,
                                zero=(1,))
    named.__dict__["_split_families"] = {
        (pp, 2): tuple(f for f in sp.split_families(pp, 2) if f.fixed_split) for pp in sp.pp}
    nb = enumerate_plans(job, named, top_k=1).plans[0]
    assert nb.plan.chunk_layers is not None
    assert nb.time.step_s > best.time.step_s * 1.01
    assert enumerate_plans(job, sp, top_k=1).plans[0].time.step_s == best.time.step_s


@pytest.mark.parametrize("sched", V)
def test_the_proof_line_and_outside_say_two_groups_are_searched(sched: str) -> None:
    job = _mixed_job(8)
    hs = SearchSpace.for_job(job, fix=f"schedule={sched},tp=8", max_pp=4)
    assert hs.free_ok(2, 2)
    line = space_line(proof_space(hs))
    assert "evaluated, not searched" not in line and "on several node groups" in line
    assert f"under {sched}: per rank" in line and "stage placement a choice" in line
    plan = Plan(dp=1, tp=8, pp=2, vpp=2, stage_layers=(6, 2), stage_groups=(1, 0),
                schedule=sched)  # type: ignore[arg-type]
    assert outside(hs, plan) is None
    # DualPipe's free family is searched on several groups too (test_dualpipe_free_multi.py)
    dp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=8", max_pp=4)
    assert "evaluated, not searched" not in space_line(proof_space(dp))
