"""Free per-stage layer counts under DualPipe on several node groups (issue 31, "one space";
search/dualpipe_splits.py): a rank runs its mirror stage on its own GPUs, so each rank's
entries are read from its group's tables; each (split, placement)'s bound (dualpipe_bound.py
`split_bounds`) is <= its exact step, the free family's key bound (`_free`) <= every key's
exact best, CP-SAT's top k equals the enumerator's on random two-group spaces (pp 2 and 4),
and an uneven free split that gives the H100 ranks' mirror pair more layers beats every named
layout and is found."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_replay_free_multi import _compare, _mixed_job

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.steptime import stage_times
from autoparallel_cp.errors import UserError
from autoparallel_cp.search import limits
from autoparallel_cp.search.dualpipe_bound import dualpipe_key_bound, key_constants, split_bounds
from autoparallel_cp.search.dualpipe_splits import ordered_splits, solve_free_dualpipe
from autoparallel_cp.search.enumerate import Degrees
from autoparallel_cp.search.enumerate_axes import partition_array, placement_array
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.model_scan import _best_of_row, best_of_key, best_of_split
from autoparallel_cp.search.replay_axis import dualpipe_free
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, key_variants
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
def test_each_split_and_placement_bound_is_below_its_exact_best(moe: bool) -> None:
    """Every free split and every stage placement: the (split, placement) bound
    (`split_bounds`) <= that pair's exact best over the recompute counts (`_best_of_row`, the
    enumerator's scoring), finite wherever a plan fits; the key's bound <= the key's exact
    best."""
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
            places, place_objs = placement_array(v.space, v, d)
            assert len(place_objs) == 6  # two groups, two stages each
            c, every, rho, synced, f = key_constants(v, key)
            bounds = split_bounds(v, c, key, rho, every, synced, np.array(f, float),
                                  np.asarray(parts, float), places)
            for (n, row), (qi, q) in itertools.product(enumerate(parts),
                                                       enumerate(place_objs)):
                got = _best_of_row(v, key, d, row, None, [q])
                if got is None:
                    continue
                assert bounds[n, qi] <= got[0] * (1 + 1e-12)
                checked += 1
                seen.add(q)
    assert checked >= 100 and len(seen) == 6


def test_a_rank_runs_its_mirror_on_its_own_gpus() -> None:
    """DeepSeek-V3 §3.2.1: each DualPipe device holds stage r and its mirror p-1-r, so on a
    two-group placement rank r has exactly the time and memory it has when every stage sits
    on its group: neither depends on where the mirror's own rank runs."""
    job = _mixed_job(8)
    base = Plan(dp=1, tp=4, pp=4, mbs=2, stage_layers=(1, 1, 2, 4), num_microbatches=16,
                schedule="dualpipe")
    mixed = base.model_copy(update={"stage_groups": (0, 1, 1, 0)})
    st, mem = stage_times(job, mixed), stage_memory(job, mixed)
    for g in (0, 1):
        one = base.model_copy(update={"stage_groups": (g,) * 4})
        st1, mem1 = stage_times(job, one), stage_memory(job, one)
        for r in range(4):
            if mixed.stage_groups[r] == g:  # type: ignore[index]
                assert st[r].total_s == st1[r].total_s
                assert mem[r].charged_bytes == mem1[r].charged_bytes
    # the A100 ranks (1, 2) run the same pair {1, 2} as each other, slower than on H100
    assert st[1].total_s == st[2].total_s
    on_h100 = stage_times(job, base.model_copy(update={"stage_groups": (0,) * 4}))
    assert st[1].total_s > 1.3 * on_h100[1].total_s


def test_an_uneven_free_split_on_two_groups_beats_every_named_layout() -> None:
    """8 layers at pp 4 on one H100 and one A100 node: a rank runs its stage and its mirror
    on its own GPUs, so the ranks holding the mirror pair {0, 3} and those holding {1, 2} each
    take (l_j + l_{p-1-j})/2 layers' time per micro-batch on their group. The A100 layer is
    slower, so the best plan puts one pair on the H100 ranks and gives it more layers than
    the other pair: a split no named layout holds, faster than every named layout on every
    placement, and moving one layer between the pairs either way is slower."""
    job = _mixed_job(8)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=4,pp=4", max_pp=4, max_mbs=2,
                             zero=(1,))
    best = solve(job, sp, top_k=1, time_limit=60).plans[0]
    assert enumerate_plans(job, sp, top_k=1).plans[0].time.step_s == best.time.step_s
    ls, q = best.plan.stage_layers, best.plan.stage_groups
    assert ls is not None and q is not None and best.plan.chunk_layers is None
    assert job.cluster.node_groups[0].gpu.name.startswith("H100")
    h100 = [r for r in range(4) if q[r] == 0]
    assert sorted(h100) in ([0, 3], [1, 2])  # one mirror pair on each group
    pair = (ls[0] + ls[3], ls[1] + ls[2])
    fast = pair[0] if h100 == [0, 3] else pair[1]
    assert fast > 8 - fast
    at = evaluate(job, best.plan).time.step_s
    i, j = (0, 1) if h100 == [0, 3] else (1, 0)  # a stage of the fast pair, one of the slow
    for a, b in ((i, j), (j, i)):  # one layer from stage a to stage b
        moved = list(ls)
        if moved[a] > 1:
            moved[a] -= 1
            moved[b] += 1
            ev = evaluate(job, best.plan.model_copy(update={"stage_layers": tuple(moved)}))
            assert ev.time.step_s > at
    named = set(named_layouts(8, 4, 1)) | {(2, 2, 2, 2)}
    assert tuple(ls) not in named
    for cl in named:
        for g in set(itertools.permutations((0, 0, 1, 1))):
            ev = evaluate(job, best.plan.model_copy(update={"stage_layers": cl,
                                                            "stage_groups": g}))
            assert ev.time.step_s > at * 1.05


def test_the_proof_line_and_outside_say_two_groups_are_searched() -> None:
    job = _mixed_job(8)
    hs = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=8", max_pp=4)
    assert hs.free_ok(2, 1) and hs.free_ok(4, 1)
    line = space_line(proof_space(hs))
    assert "evaluated, not searched" not in line
    assert "under dualpipe: rank r runs stage r and its mirror" in line
    assert "both stages of a rank timed on the rank's group" in line
    plan = Plan(dp=1, tp=8, pp=2, stage_layers=(6, 2), stage_groups=(1, 0),
                schedule="dualpipe")
    assert outside(hs, plan) is None


def test_the_exact_loop_at_cutoffs_and_out_of_budget() -> None:
    """`solve_free_dualpipe` on a two-group key: unlimited, it returns the best of every
    split scored one by one (`best_of_split`), proven; at a cutoff just below that step it
    proves nothing is left (None, proven), at the step itself it returns it again; with a
    budget spent after the first split it returns that split's best, unproven, with an error
    bound that covers the gap to the true best."""
    job = _mixed_job(8)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=4,pp=4,mbs=2,zero=1", max_pp=4)
    t = build_tables(sp)
    key = build_key_table(t).key(0)
    (v,) = [v for v in key_variants(t, key) if dualpipe_free(v.space)]
    parts, _ = partition_array(v.space, key.pp, key.vpp)
    scored = [(got[0], got[1].key()) for r in parts
              if (got := best_of_split(v, key, tuple(int(x) for x in r))) is not None]
    want = min(scored)
    got, proven = solve_free_dualpipe(v, key, seed=0, workers=1, cutoff_s=None,
                                      budget=Budget(None))
    assert got is not None and (got[0], got[1].key()) == want and got[3] == 0.0
    below, proven = solve_free_dualpipe(v, key, seed=0, workers=1, cutoff_s=want[0] * 0.999,
                                        budget=Budget(None))
    assert below is None and proven
    at, _ = solve_free_dualpipe(v, key, seed=0, workers=1, cutoff_s=want[0],
                                budget=Budget(None))
    assert at is not None and at[0] == want[0]
    fresh = build_tables(sp)  # no memo: one split scored, then the budget is spent
    budget = Budget(None)
    budget.dtime = limits.MODEL_PLAN_DTIME / 2
    part, proven = solve_free_dualpipe(fresh, key, seed=0, workers=1, cutoff_s=None,
                                       budget=budget)
    _, bounds = ordered_splits(fresh, key)
    assert part is not None and part[0] >= want[0]
    # unproven: the error bound is the gap to the next split's bound, and it covers the best
    assert part[3] == part[0] - bounds[1] > 0.0
    assert part[0] - part[3] <= want[0] * (1 + 1e-12)


def test_at_pp_2_every_split_bounds_alike_on_two_groups() -> None:
    """At pp 2 both ranks hold the one mirror pair {0, 1}, i.e. every layer, the embedding and
    the head, each on its own GPUs: a rank's time is the same whatever the split, so every
    split that fits has the same bound on a placement (the split moves memory only). Timing a
    mirror on its own stage's group instead (the model before session 26) made the bound
    fall as the A100 stage's count fell."""
    job = _mixed_job(8)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=4,pp=2,mbs=2,zero=1", max_pp=4)
    t = build_tables(sp)
    key = build_key_table(t).key(0)
    (v,) = [v for v in key_variants(t, key) if dualpipe_free(v.space)]
    d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
    parts, _ = partition_array(v.space, key.pp, key.vpp)
    places, _ = placement_array(v.space, v, d)
    assert len(parts) == 7 and len(places) == 2
    c, every, rho, synced, f = key_constants(v, key)
    b = split_bounds(v, c, key, rho, every, synced, np.array(f, float),
                     np.asarray(parts, float), places)
    for q in range(len(places)):
        col = b[:, q][np.isfinite(b[:, q])]
        assert len(col) >= 2 and np.allclose(col, col[0], rtol=1e-12, atol=0.0)
