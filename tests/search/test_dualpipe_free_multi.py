"""Free per-stage layer counts under DualPipe on several node groups (issue 31, "one space";
search/cpsat_dualpipe.py): the stage placement is a choice of the per-key model, each stage's
entries read from its group's tables, so the model's objective is <= the exact step of every
(split, placement), the free family's key bound (dualpipe_bound.py `_free`) <= every key's
exact best, CP-SAT's top k equals the enumerator's on random two-group spaces (pp 2 and 4),
and an uneven free split that gives the faster group's stage more layers beats every named
layout and is found. On one group, the exact loop's orbit (the splits with the same pair
sums) is what the model cannot tell apart."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from test_replay_free_multi import _compare, _mixed_job
from test_solver_vs_enumerate import _mini, _mixed_small

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.errors import UserError
from autoparallel_cp.search.cpsat_dualpipe import build
from autoparallel_cp.search.dualpipe_bound import dualpipe_key_bound
from autoparallel_cp.search.enumerate import Degrees
from autoparallel_cp.search.enumerate_axes import partition_array, placement_array
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.model_scan import _best_of_row, best_of_key
from autoparallel_cp.search.replay_axis import dualpipe_free
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, key_variants
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.splits import named_layouts


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=8, pp=2, tp=4, seq=4096, batch=32)
@example(moe=True, layers=8, pp=4, tp=2, seq=2048, batch=32)
@given(moe=st.booleans(), layers=st.sampled_from([6, 8, 10]), pp=st.sampled_from([2, 4]),
       tp=st.sampled_from([1, 2, 4]), seq=st.sampled_from([2048, 8192]),
       batch=st.sampled_from([16, 32]))
def test_free_dualpipe_on_two_groups_matches_enumeration(moe: bool, layers: int, pp: int,
                                                         tp: int, seq: int,
                                                         batch: int) -> None:
    job = _mixed_job(layers, moe, seq, batch)
    try:
        space = SearchSpace.for_job(job, fix=f"schedule=dualpipe,pp={pp},tp={tp}", max_pp=4,
                                    max_mbs=1, zero=(1,))
    except UserError:
        return  # no plan of this pin (exit 2)
    if space.num_degree_combinations() == 0:
        return
    assert space.heterogeneous and dualpipe_free(space) and space.free_ok(pp, 1)
    _compare(job, space, 3)


@pytest.mark.parametrize("moe", [False, True])
def test_the_model_objective_bounds_every_split_and_placement(moe: bool) -> None:
    """Every free split and every stage placement pinned in its key's model: the model keeps
    every (split, placement) with a fitting plan, and its objective <= that pair's exact best
    over the recompute counts (`_best_of_row`, the enumerator's scoring); the key's bound <=
    the key's exact best."""
    job = _mixed_job(8, moe, batch=64)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=2,cp=1,pp=4,mbs=1,zero=1",
                             max_pp=4)
    t = build_tables(sp)
    kt = build_key_table(t)
    checked, seen = 0, set()
    for i in range(min(len(kt.lb), 3)):
        key = kt.key(i)
        d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
        for v in key_variants(t, key):
            if not dualpipe_free(v.space):
                continue
            exact = best_of_key(v, key)
            if exact is not None:
                assert dualpipe_key_bound(v, key) <= exact[0] * (1 + 1e-12)
            parts, _ = partition_array(v.space, key.pp, key.vpp)
            _, place_objs = placement_array(v.space, v, d)
            assert len(place_objs) == 6  # two groups, two stages each
            for row, q in itertools.product(parts, place_objs):
                got = _best_of_row(v, key, d, row, None, [q])
                if got is None:
                    continue
                dm = build(v, key)
                assert dm is not None and q is not None and not dm.one_group
                for x, n in zip(dm.layers, row, strict=True):
                    dm.model.add(x == int(n))
                for yj, g in zip(dm.groups, q, strict=True):
                    dm.model.add(yj[g] == 1)
                s = cp_model.CpSolver()
                s.parameters.num_workers = 1
                assert s.solve(dm.model) == cp_model.OPTIMAL  # a fitting plan stays in
                assert s.objective_value * dm.scale_s <= got[0] * (1 + 1e-12)
                checked += 1
                seen.add(q)
    assert checked >= 100 and len(seen) == 6


def test_an_uneven_free_split_on_two_groups_beats_every_named_layout() -> None:
    """8 layers at pp 2: each rank runs both stages, its time the mean of the two stage times,
    each stage timed on its own group (cost/steptime.py `_dualpipe_rank`), so the step falls
    with t_0 + t_1 and the best plan puts all but one layer on the H100 stage: (1, 7) with
    stage 0 on the A100 (group 1), a split no named layout holds, faster than every named
    layout on either placement. Before the free family was searched on several groups the
    search returned a named layout."""
    job = _mixed_job(8)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=4,pp=2", max_pp=4, max_mbs=2,
                             zero=(1,))
    best = solve(job, sp, top_k=1, time_limit=60).plans[0]
    assert best.plan.stage_layers == (1, 7) and best.plan.stage_groups == (1, 0)
    assert best.plan.chunk_layers is None
    assert job.cluster.node_groups[0].gpu.name.startswith("H100")
    assert enumerate_plans(job, sp, top_k=1).plans[0].time.step_s == best.time.step_s
    # by hand: moving a layer from the A100 stage to the H100 stage shortens both ranks
    at = evaluate(job, best.plan)
    one_more = evaluate(job, best.plan.model_copy(update={"stage_layers": (2, 6)}))
    assert at.time.step_s < one_more.time.step_s
    named = {*named_layouts(8, 2, 1), (4, 4)}
    assert (1, 7) not in named
    for cl in named:
        for q in ((0, 1), (1, 0)):
            ev = evaluate(job, best.plan.model_copy(update={"stage_layers": cl,
                                                            "stage_groups": q}))
            assert ev.time.step_s > best.time.step_s * 1.01


def test_the_proof_line_and_outside_say_two_groups_are_searched() -> None:
    job = _mixed_job(8)
    hs = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=8", max_pp=4)
    assert hs.free_ok(2, 1) and hs.free_ok(4, 1)
    line = space_line(proof_space(hs))
    assert "evaluated, not searched" not in line
    assert "under dualpipe: rank r runs stage r and its mirror" in line
    assert "the placement a choice of the same model" in line
    plan = Plan(dp=1, tp=8, pp=2, stage_layers=(6, 2), stage_groups=(1, 0),
                schedule="dualpipe")
    assert outside(hs, plan) is None


def test_one_group_orbits_tie_in_the_model() -> None:
    """On one node group the model's objective reads the pair sums only, so every split of an
    `orbit` has the same least objective (the loop scores the orbit in one round), and the
    orbit is every split of the model's counts with those sums."""
    job = Job(model=_mini(False, 8), cluster=_mixed_small().model_copy(update={
        "node_groups": _mixed_small().node_groups[:1]}), seq_len=4096, global_batch=32)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=2,pp=4,mbs=1,zero=1", max_pp=4)
    t = build_tables(sp)
    key = build_key_table(t).key(0)
    dm = build(t, key)
    assert dm is not None and dm.one_group
    orbit = dm.orbit((2, 1, 3, 2))
    parts, _ = partition_array(sp, 4, 1)
    want = sorted(tuple(int(x) for x in r) for r in parts if r[0] + r[3] == 4
                  and r[1] + r[2] == 4)
    assert orbit == want and len(orbit) == 9
    vals = set()
    for split in orbit:
        dm2 = build(t, key)
        assert dm2 is not None
        for x, n in zip(dm2.layers, split, strict=True):
            dm2.model.add(x == n)
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1
        if s.solve(dm2.model) == cp_model.OPTIMAL:
            vals.add(s.objective_value)
    assert len(vals) == 1
