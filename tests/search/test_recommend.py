"""Complexity score, simplest-within-tolerance (CP-SAT phase two), single-change advice."""

from __future__ import annotations

import pytest

from autoparallel_cp import api
from autoparallel_cp.search.neighbours import single_changes
from autoparallel_cp.search.recommend import (
    COMPLEXITY_WEIGHTS,
    axis_weight,
    complexity,
    complexity_terms,
    pick_simplest,
    recommend,
    simplest_within,
    weight_table,
)
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan, plan_violations

NARROW = "pp=1,cp=1,vpp=1"


@pytest.fixture(scope="module")
def job() -> Job:
    return api.make_job("gpt3-1.3b", "dgx-h100", gpus=8, seq_len=2048, global_batch=32)


def test_complexity_is_a_sum_of_axis_value_weights() -> None:
    assert complexity(Plan(dp=64)) == 0
    p = Plan(dp=2, tp=8, pp=4, vpp=2, cp=2, zero=3, recompute="full", sp=1)
    expected = sum(axis_weight(a, getattr(p, a)) for a in COMPLEXITY_WEIGHTS)
    assert complexity(p) == expected == 2 + 2 + 3 + 4 + 4 + 3
    assert weight_table("zero", [0, 1, 2, 3]) == [0, 0, 1, 4]
    assert weight_table("recompute", ["none", "selective", "full"]) == [0, 1, 3]
    assert complexity(p.model_copy(update={"recompute_layers": 2})) == complexity(p) + 1
    assert complexity_terms(p)[0].startswith(("context parallelism", "ZeRO-3"))


def test_pick_simplest_within_tolerance() -> None:
    fast = Plan(dp=2, tp=4, cp=2)
    simple = Plan(dp=8, tp=2)
    simplest_but_slow = Plan(dp=16)
    cands = [(fast, 1.00), (simple, 1.02), (simplest_but_slow, 1.10)]
    assert pick_simplest(cands, 0.03) == (simple, 1.02)
    assert pick_simplest(cands, 0.0) == (fast, 1.00)
    assert pick_simplest(cands, 0.2) == (simplest_but_slow, 1.10)


def test_phase_two_matches_brute_force(job: Job) -> None:
    res = api.enumerate_plans(job, top_k=10_000, fix=NARROW)
    evs = res.plans
    best = evs[0].time.step_s
    for tol in (0.0, 0.01, 0.05):
        out = simplest_within(job, best * (1 + tol), fix=NARROW, time_limit=20, workers=2)
        assert out is not None
        plan, step = out
        exact = api.evaluate(job, plan)
        assert exact.fits and exact.time.step_s == pytest.approx(step)
        assert step <= best * (1 + tol) * (1 + 1e-9)
        brute = min(complexity(e.plan) for e in evs if e.time.step_s <= best * (1 + tol))
        assert complexity(plan) == brute


def test_recommend_reports_the_trade(job: Job) -> None:
    res = api.solve(job, top_k=3, time_limit=10, workers=2, fix=NARROW)
    ranked = [(e.plan, e.time.step_s) for e in res.plans]
    rec = recommend(job, ranked, 0.05, fix=NARROW, time_limit=10, workers=2)
    assert rec.method == "cp-sat phase 2"
    assert rec.step_s <= rec.fastest_step_s * 1.05 * (1 + 1e-9)
    assert rec.complexity <= rec.fastest_complexity
    assert rec.why()
    top_only = recommend(job, ranked, 0.05, phase_two=False)
    assert top_only.method == "top-k" and top_only.complexity >= rec.complexity


@pytest.mark.parametrize("tol", [0.0, 0.02, 0.10])
def test_phase_two_reusing_the_solve_matches_brute_force(job: Job, tol: float) -> None:
    """With the solve's SearchContext (its listed keys and scored keys), phase two returns a
    plan as simple as the brute-force simplest within the tolerance, and the same plan as
    phase two without it; tolerances below and above the solve's last window (the k-th best)
    are both covered."""
    res = api.solve(job, top_k=3, time_limit=10, fix=NARROW)
    assert res.context is not None and res.context.listed_hi is not None
    best = res.plans[0].time.step_s
    alone = simplest_within(job, best * (1 + tol), fix=NARROW, time_limit=20)
    reused = simplest_within(job, best * (1 + tol), fix=NARROW, time_limit=20,
                             context=res.context)
    assert alone is not None and reused is not None
    assert reused[0].key() == alone[0].key() and reused[1] == pytest.approx(alone[1])
    brute = api.enumerate_plans(job, top_k=10_000, fix=NARROW)
    qualifying = [e for e in brute.plans if e.time.step_s <= best * (1 + tol) * (1 + 1e-9)]
    assert complexity(reused[0]) == min(complexity(e.plan) for e in qualifying)


def test_single_changes_are_legal_fitting_and_faster(job: Job) -> None:
    plan = api.as_plan(job, "tp=8,mbs=1,zero=0,recompute=full")
    now = api.evaluate(job, plan).to_json()
    changes = single_changes(job, plan, now)
    assert changes, "a fully recomputed tp=8 plan of a 1.3B model can surely be improved"
    for ch in changes:
        assert plan_violations(job, ch.plan) == []
        assert ch.fits and ch.step_s < now["time"]["step_s"]
    assert [c.step_s for c in changes] == sorted(c.step_s for c in changes)
