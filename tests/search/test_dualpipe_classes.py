"""DualPipe's free splits by pair-sum class (search/dualpipe_classes.py, dualpipe_pairs.py):
the pair tables and `compose` give `plan_terms`'s step and fits bit for bit on random plans
(one and two node groups, dense and MoE with a dense prefix, ZeRO-3, recompute counts), the
class search equals the enumerator's top k on random small spaces forced through it (one
group and an H100 + A100 mix), and on llama3-70b at pp 4 (79,079 splits, 77 classes) its
best equals a brute force over every split composed exactly, every class bound below its
members."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_replay_free_multi import _compare, _mixed_job
from test_zb_search import _job

from autoparallel_cp.api import make_job
from autoparallel_cp.errors import UserError
from autoparallel_cp.search import dualpipe_classes, replay_axis
from autoparallel_cp.search.dualpipe_classes import _Key, class_array, solve_by_class
from autoparallel_cp.search.dualpipe_pairs import compose, probe_plan
from autoparallel_cp.search.enumerate_axes import partition_array
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.model_scan import best_of_split
from autoparallel_cp.search.model_scored import plan_terms
from autoparallel_cp.search.replay_axis import by_class, dualpipe_free, num_classes
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import proof_space, space_line
from autoparallel_cp.search.tables import build_tables, key_variants
from autoparallel_cp.spec.plan import canonical


def _variant(job: Any, fix: str, **kw: Any) -> tuple[Any, Any]:
    """The first key of a DualPipe space and its free-family tables."""
    sp = SearchSpace.for_job(job, fix=fix, **kw)
    t = build_tables(sp)
    key = build_key_table(t).key(0)
    (v,) = [v for v in key_variants(t, key) if dualpipe_free(v.space)]
    return v, key


def _exact_of(v: Any, key: Any, split: tuple[int, ...], q: int, r: Any, k: _Key
              ) -> tuple[float, bool]:
    """The class search's composition of one (split, placement, recompute): its step and
    whether every rank fits."""
    p = key.pp
    tot, exp, opt = [np.zeros(0)] * p, [np.zeros(0)] * p, [np.zeros(0)] * p
    fits = True
    for i, pr in enumerate(k.tables[r]):
        n = int(np.nonzero((pr.a == split[i]) & (pr.b == split[p - 1 - i]))[0][0])
        for rank, side in ((i, pr.lo), (p - 1 - i, pr.hi)):
            s = side[int(k.places[q][rank])]
            tot[rank], exp[rank], opt[rank] = s.tot[n:n + 1], s.exp[n:n + 1], s.opt[n:n + 1]
            fits = fits and bool(s.fits[n])
    return float(compose(k.consts[r], tot, exp, opt)[0]), fits


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@example(mixed=True, moe=True, zero=3, mode="full")
@example(mixed=False, moe=True, zero=1, mode="none")
@given(mixed=st.booleans(), moe=st.booleans(), zero=st.sampled_from([1, 3]),
       mode=st.sampled_from(["none", "selective", "full"]))
def test_the_tables_compose_the_cost_models_step_bit_for_bit(mixed: bool, moe: bool,
                                                             zero: int, mode: str) -> None:
    """Every split of 10 layers at pp 4, every placement and recompute count: the class
    search's step and fits == `plan_terms`'s (the enumerator's scoring), bit for bit."""
    job = _mixed_job(10, moe) if mixed else _job(moe, 10, 8, 4096, 32)
    try:
        v, key = _variant(job, f"schedule=dualpipe,pp=4,tp=2,cp=1,mbs=1,zero={zero},"
                          f"recompute={mode}", max_pp=4, partial_recompute=True)
    except (UserError, ValueError):
        return
    k = _Key(v, key)
    parts, _ = partition_array(v.space, 4, 1)
    checked = 0
    for row, r in itertools.product(parts, k.rls):
        split = tuple(int(x) for x in row)
        for q, obj in enumerate(k.place_objs):
            plan = canonical(probe_plan(v, key, r).model_copy(
                update={"stage_layers": split, "stage_groups": obj}), 10)
            step, *_, fits = plan_terms(v.space.job, plan)
            got, ok = _exact_of(v, key, split, q, r, k)
            assert ok == fits
            assert got == step, (split, q, r, got, step)
            checked += 1
    assert checked >= 84


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every DualPipe free family solved by class (no split-by-split loop)."""
    monkeypatch.setattr(replay_axis, "DUALPIPE_FREE_MAX", 0)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@example(mixed=False, moe=False, layers=10, pp=4, tp=2, seq=4096)
@example(mixed=True, moe=True, layers=8, pp=4, tp=2, seq=2048)
@given(mixed=st.booleans(), moe=st.booleans(), layers=st.sampled_from([6, 8, 10]),
       pp=st.sampled_from([2, 4]), tp=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([2048, 8192]))
def test_by_class_equals_the_enumerator(forced: None, mixed: bool, moe: bool, layers: int,
                                        pp: int, tp: int, seq: int) -> None:
    """The class search's top 3 == the enumerator's (the same exact floats, plans and
    placements), one node group and an H100 + A100 mix, dense and MoE."""
    job = _mixed_job(layers, moe, seq) if mixed else _job(moe, layers, 8, seq, 32)
    try:
        space = SearchSpace.for_job(job, fix=f"schedule=dualpipe,pp={pp},tp={tp}", max_pp=4,
                                    max_mbs=1, zero=(1,))
    except UserError:
        return
    if space.num_degree_combinations() == 0:
        return
    assert by_class(space, pp)
    _compare(job, space, 3)


def test_llama3_70b_pp4_equals_a_brute_force_over_every_split() -> None:
    """llama3-70b on 512 H100 at pp 4: 79,079 splits in 77 classes. Every split composed
    exactly (the pair tables, vectorised) for every recompute count: the least (step, split)
    is the class search's answer, which the cost model scores to the same float; every
    class's bound is <= each of its fitting members' step."""
    job = make_job("llama3-70b", "dgx-h100", gpus=512, seq_len=8192, global_batch=512)
    v, key = _variant(job, "schedule=dualpipe,pp=4,tp=4,cp=2,mbs=1,zero=1,recompute=none")
    assert by_class(v.space, 4) and num_classes(v.space, 4) == 77
    k = _Key(v, key)
    parts, _ = partition_array(v.space, 4, 1)
    assert len(parts) == 79079 and len(k.places) == 1 and k.rls == [None]
    pr = k.tables[None]
    L = 80
    cols: list[Any] = [None] * 12
    fits = np.ones(len(parts), bool)
    for i in range(2):
        a, b = parts[:, i], parts[:, 3 - i]
        n = np.full((L + 1, L + 1), -1)
        n[pr[i].a, pr[i].b] = np.arange(len(pr[i].a))
        idx = n[a, b]
        assert np.all(idx >= 0)
        for rank, side in ((i, pr[i].lo[0]), (3 - i, pr[i].hi[0])):
            cols[3 * rank:3 * rank + 3] = side.tot[idx], side.exp[idx], side.opt[idx]
            fits &= side.fits[idx]
    step = np.where(fits, compose(k.consts[None], cols[0::3], cols[1::3], cols[2::3]),
                    math.inf)
    best = float(np.min(step))
    uniform = (20, 20, 20, 20)
    ties = sorted(tuple(int(x) for x in r) for r in parts[step == best])
    want = uniform if uniform in ties else ties[0]
    got, _ = solve_by_class(v, key, cutoff_s=None, budget=Budget(None))
    assert got is not None and got[0] == best
    assert got[1].layers_per_stage(L) == want
    one = best_of_split(v, key, want)
    assert one is not None and one[0] == best
    # the class bounds: each <= every fitting member's step
    cls = parts[:, 0] + parts[:, 3]
    for n, s in enumerate(k.classes[k.order]):
        members = step[cls == s[0]]
        if np.any(np.isfinite(members)):
            assert k.bounds[n] <= np.min(members) * (1 + 1e-12)


def test_the_cap_now_counts_classes_and_the_proof_line_says_so() -> None:
    """80 layers: pp 4 and pp 8 searched by listed class, pp 16 by class found best-first
    (about 1e9 classes), pp 32 and 64 not; a MoE with MoE every other layer keeps the
    split-by-split cap (its stages' kinds depend on where they start)."""
    job = make_job("llama3-70b", "dgx-h100", gpus=512, seq_len=8192, global_batch=512)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe")
    assert num_classes(sp, 4) == 77 and num_classes(sp, 8) == 67525
    assert num_classes(sp, 16) > 10**9
    assert sp.free_ok(4, 1) and sp.free_ok(8, 1) and sp.free_ok(16, 1)
    assert not sp.free_ok(32, 1) and not sp.free_ok(64, 1)
    assert len(class_array(80, 4, 2)) == 67525
    line = space_line(proof_space(sp))
    assert "at pp 2,4,8,16," in line and "at pp 4,8, by pair-sum class" in line
    assert "and, at pp 16, by pair-sum class found best-first" in line
    assert "at pp 32,64 the named layouts only" in line and "classes above pp 16" in line


def test_out_of_budget_is_unproven_and_bounded(forced: None) -> None:
    """Budget spent after the first class: its best, unproven, its error bound covering the
    gap to the exact best."""
    job = _mixed_job(8)
    v, key = _variant(job, "schedule=dualpipe,tp=4,pp=4,mbs=2,zero=1", max_pp=4)
    want, _ = solve_by_class(v, key, cutoff_s=None, budget=Budget(None))
    fresh, _ = _variant(job, "schedule=dualpipe,tp=4,pp=4,mbs=2,zero=1", max_pp=4)
    budget = Budget(None)
    budget.dtime = dualpipe_classes.limits.MODEL_PLAN_DTIME / 2
    part, _ = solve_by_class(fresh, key, cutoff_s=None, budget=budget)
    assert want is not None and part is not None and part[0] >= want[0]
    assert part[0] - part[3] <= want[0] * (1 + 1e-12)
    below, proven = solve_by_class(v, key, cutoff_s=want[0] * 0.999, budget=Budget(None))
    assert below is None and proven
