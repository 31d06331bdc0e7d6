"""A pinned activation offload's pp > 1 parts on several node groups (issue 31, "one space";
search/act_offload.py, act_offload_free.py, act_offload_bound.py): the stage placement is a
decision, each stage's entries its own group's. CP-SAT's top k equals the enumerator's on
random two-group spaces, the free model's objective is <= every (split, placement)'s exact
best, the key bound <= every key's exact best and the master's LB too, a mutated bound is
caught, and a pp > 1 plan on both groups (the one-stage family has none there) is found."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_offload_search import _cluster
from test_replay_free_multi import solve_pinned
from test_solver_vs_enumerate import _assert_master_bounds, _mini, _mixed_small

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.search.act_offload import free_at, scored
from autoparallel_cp.search.act_offload_bound import (
    StageCoefs,
    offload_key_bound,
    placed,
    stage_coefs,
)
from autoparallel_cp.search.act_offload_free import build
from autoparallel_cp.search.enumerate import Degrees
from autoparallel_cp.search.enumerate_axes import partition_array, placement_array
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.model_scan import _best_of_row, best_of_key
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, key_variants
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


def _hosted() -> object:
    """One H100 node (group 0) and one A100 node (group 1), a DGX A100 host on each."""
    host = _cluster(8).node_groups[0].host
    c = _mixed_small()
    return c.model_copy(update={"node_groups": [g.model_copy(update={"host": g.host or host})
                                                for g in c.node_groups]})


def _job(layers: int, moe: bool = False, seq: int = 4096, batch: int = 32) -> Job:
    return Job(model=_mini(moe, layers), cluster=_hosted(), seq_len=seq,  # type: ignore[arg-type]
               global_batch=batch)


def _ident(p: Plan, layers: int) -> tuple[object, ...]:
    return (p.key()[:10], p.recompute_layers, p.layers_per_stage(layers), p.stage_groups,
            p.chunk_layers, p.schedule, p.activation_offload)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=8, pp=2, tp=4, vpp=1, rc="none")
@example(moe=True, layers=8, pp=4, tp=2, vpp=1, rc="full")
@example(moe=False, layers=8, pp=2, tp=4, vpp=2, rc="selective")
@given(moe=st.booleans(), layers=st.sampled_from([6, 8]), pp=st.sampled_from([2, 4]),
       tp=st.sampled_from([2, 4]), vpp=st.sampled_from([1, 2]),
       rc=st.sampled_from(["none", "selective", "full"]))
def test_two_groups_match_enumeration(moe: bool, layers: int, pp: int, tp: int, vpp: int,
                                      rc: str) -> None:
    """CP-SAT's top 3 equals the enumerator's (the same exact costs, splits and placements):
    the free family's placement is the model's decision, the enumerator walks every order."""
    job = _job(layers, moe)
    try:
        space = SearchSpace.for_job(job, fix=f"activation_offload=2,pp={pp},tp={tp},vpp={vpp},"
                                    f"recompute={rc}", max_pp=4, max_mbs=1, zero=(1,))
    except UserError:
        return  # no plan of these pins (exit 2)
    if space.num_degree_combinations() == 0:
        return
    try:
        b = enumerate_plans(job, space, top_k=3)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve(job, space, top_k=3, time_limit=120)
        return
    a = solve(job, space, top_k=3, time_limit=120)
    assert a.status == "optimal" and a.error_bound_s == 0.0
    assert [(c, _ident(p, layers)) for c, p in a.stats["ranked"]] == [
        (c, _ident(p, layers)) for c, p in b.stats["ranked"]]


def _keys(pp: int, vpp: int = 1, n: int = 4, batch: int = 64) -> tuple[object, list[object]]:
    job = _job(8, batch=batch)
    sp = SearchSpace.for_job(job, fix=f"activation_offload=2,tp=2,cp=1,pp={pp},vpp={vpp},"
                             "mbs=1,zero=1", max_pp=4)
    (part,) = [v for v in sp.schedule_variants() if scored(v)]
    t = build_tables(part)
    kt = build_key_table(t)
    return t, [kt.key(i) for i in range(min(len(kt.lb), n))]


@pytest.mark.parametrize("pp", [2, 4])
def test_the_model_objective_bounds_every_split_and_placement(pp: int) -> None:
    """Every free split and stage placement pinned in the key's model: the objective is <=
    that pair's exact best over the recompute counts (`_best_of_row`, the enumerator's
    scoring), and the key bound (per placement) <= the key's exact best."""
    t0, keys = _keys(pp)
    checked, seen = 0, set()
    for key in keys:
        d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
        for v in key_variants(t0, key):
            assert free_at(v.space, pp, 1)
            exact = best_of_key(v, key)
            if exact is not None:
                assert offload_key_bound(v, key) <= exact[0] * (1 + 1e-12)
            parts, _ = partition_array(v.space, pp, 1)
            _, place_objs = placement_array(v.space, v, d)
            assert len(place_objs) == math.comb(pp, pp // 2)
            for row, q in itertools.product(parts, place_objs):
                got = _best_of_row(v, key, d, row, None, [q])
                if got is None:
                    continue
                om = build(v, key)
                assert om is not None and q is not None
                s = solve_pinned(om.model, om.layers, om.groups, row, q)
                assert s.objective_value * om.scale_s <= got[0] * (1 + 1e-12)
                # and the bound's own value of the pair
                sc = placed({g: stage_coefs(v, key, g) for g in (0, 1)}, q)
                assert sc.value(row) <= got[0] * (1 + 1e-12)
                checked += 1
                seen.add(q)
    assert checked >= 20 and len(seen) == math.comb(pp, pp // 2)


def _rest_to_last(sc: StageCoefs, p: int, L: int, lo: int, lo0: int, step: int) -> float:
    """The free bound's S term as the one-group code took it (every layer above the minima on
    the last stage): a mutation, valid on one group only."""
    rest = L - lo0 - (p - 2) * lo
    S = float(np.sum(sc.per_stage(np.asarray([lo0, *([lo] * (p - 2)), rest]))[0]))
    good = sc.free_value(p, L, lo, lo0, step)
    split = [lo0, *([lo] * (p - 1))]
    mains = np.broadcast_to(np.asarray(sc.time[0], float), (p,))
    split[p - 1 - int(np.argmin(mains[::-1]))] += L - lo0 - (p - 1) * lo
    S_good = float(np.sum(sc.per_stage(np.asarray(split))[0]))
    return good + sc.b * (S - S_good)


def test_mutated_bounds_are_caught() -> None:
    """Two mutations exceed some key's exact best on two groups: the slowest group's entries
    on every stage (one group's StageCoefs for a mixed placement), and the free bound's sum
    S taken with the extra layers on the last stage (the one-group rule: the last stage
    on the A100 is the slowest place for them)."""
    t0, keys = _keys(2, n=6, batch=8)  # m = 2: the bubble's S term weighs as much as m·T
    slow = rest = 0
    for key in keys:
        for v in key_variants(t0, key):
            exact = best_of_key(v, key)
            if exact is None:
                continue
            scs = {g: stage_coefs(v, key, g) for g in (0, 1)}
            if scs[1].value(np.asarray([4, 4])) > exact[0]:
                slow += 1
            assert placed(scs, (1, 0)).free_value(2, 8, 2, 2, 1) <= exact[0] * (1 + 1e-12)
            if _rest_to_last(placed(scs, (0, 1)), 2, 8, 2, 2, 1) > exact[0]:
                rest += 1
    assert slow and rest


def test_master_bounds_hold_on_two_groups() -> None:
    """The master's LB (the activation tables scaled by `lower_acts`, one factor for both
    groups) <= every key's exact best on two groups, pinned offload."""
    job = _job(8, batch=64)
    sp = SearchSpace.for_job(job, fix="activation_offload=2,tp=2,mbs=1,zero=1", max_pp=4)
    _assert_master_bounds(job, sp, 1)


def test_a_pp2_plan_on_both_groups_is_found() -> None:
    """Llama-like 8 layers on one H100 and one A100 node with the pin: no one-stage plan
    spans the two groups (before: no feasible plan, the pin kept pp = 1 there); the search
    finds a pp > 1 plan with a stage on each group, the enumerator's best, and evaluate
    agrees with its step."""
    job = _job(8, batch=64)
    sp = SearchSpace.for_job(job, fix="activation_offload=2,tp=2", max_pp=4, max_mbs=1,
                             zero=(1,))
    assert sp.pp != (1,)
    best = solve(job, sp, top_k=1, time_limit=60).plans[0]
    assert best.plan.pp > 1 and best.plan.activation_offload == 2
    assert set(best.plan.stage_groups or ()) == {0, 1}
    assert enumerate_plans(job, sp, top_k=1).plans[0].time.step_s == best.time.step_s
    assert evaluate(job, best.plan).time.step_s == pytest.approx(best.time.step_s)
    line = space_line(proof_space(sp))
    assert "every stage placement on the node groups" in line
    assert outside(sp, best.plan) is None
