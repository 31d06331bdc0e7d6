"""Contracts of the search modules that the solver-vs-enumerator tests do not reach (issue 16,
mutation testing): the master lists only legal keys, `forbid` cuts off the partition just found,
`best_for_key` builds a key's own tables, pins outside the default domains are kept, a solve cut
by the wall-clock net is flagged, phase two keeps the user's pins, and the recommendation's
labels and sentence, derived by hand from the weights search/recommend.py's docstring states
(tp/pp/ep > 1: 2, cp > 1: 4, vpp > 1: 3, ZeRO-2: 1, ZeRO-3: 4, recompute selective 1 / full 3,
partial full recompute +1)."""

from __future__ import annotations

import time

import pytest
from ortools.sat.python import cp_model
from test_solver_vs_enumerate import _mini

from autoparallel_cp import api
from autoparallel_cp.errors import InputError, UserError
from autoparallel_cp.search import limits
from autoparallel_cp.search.cpsat_master import build_master, enumerate_keys
from autoparallel_cp.search.cpsat_partition import build_partition
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.recommend import (
    Recommendation,
    complexity,
    complexity_terms,
    recommend,
)
from autoparallel_cp.search.solve import best_for_key, key_space
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan, plan_violations


def _job(batch: int = 32) -> Job:
    return api.make_job("gpt3-1.3b", "dgx-h100", gpus=8, seq_len=2048, global_batch=batch)


def test_every_master_key_is_a_legal_plan() -> None:
    """The master's degree rules (cpsat_axes) against spec/plan.py's rules, on every key it
    lists: sp needs tp > 1, interleaving needs pp > 1 and pp | m (Megatron), and so on."""
    job = _job(batch=12)  # m = 12 / dp: pp = 8 does not divide m = 12
    space = SearchSpace.for_job(job, fix="zero=1,recompute=none,mbs=1", max_vpp=2)
    master = build_master(build_tables(space))
    keys, capped = enumerate_keys(master, None, 10**12)
    assert not capped and keys
    L = job.model.num_layers
    seen = set()
    for _, k in keys:
        units, pp = L // k.vpp, k.pp
        split = tuple(k.vpp * (units // pp + (j < units % pp)) for j in range(pp))
        plan = Plan(dp=k.dp, tp=k.tp, pp=k.pp, vpp=k.vpp, cp=k.cp, ep=k.ep, sp=k.sp,
                    zero=k.zero, mbs=k.mbs, num_microbatches=k.m,
                    recompute=RECOMPUTE_MODES[k.mode], stage_layers=split)
        assert not plan_violations(job, plan), (k, plan_violations(job, plan))
        seen.add((k.sp, k.tp > 1, k.vpp > 1, k.m % k.pp == 0))
    # the listing holds keys on the legal side of each rule: sp with tp > 1, interleaved
    # with pp | m, and keys whose m the pp does not divide (not interleaved)
    assert (1, True, True, True) in seen and (0, False, False, False) in seen


def _knapsack(n: int) -> cp_model.CpModel:
    """A strongly correlated 0/1 knapsack of n items (value = weight + 100, weights from a
    fixed LCG): 3,000 items are far from proven optimal in 10 ms."""
    m = cp_model.CpModel()
    w, seed = [], 12345
    for _ in range(n):
        seed = (1103515245 * seed + 12345) % 2**31
        w.append(1 + seed % 1000)
    x = [m.new_bool_var(f"x{i}") for i in range(n)]
    m.add(sum(wi * xi for wi, xi in zip(w, x, strict=True)) <= sum(w) // 2)
    m.maximize(sum((wi + 100) * xi for wi, xi in zip(w, x, strict=True)))
    return m


def test_a_solve_cut_by_the_wall_clock_net_is_flagged() -> None:
    b = limits.Budget(10.0)
    b.deadline = time.monotonic() - 1.0  # the net has passed: the solve gets 0.01 s
    st = b.solve(cp_model.CpSolver(), _knapsack(3000))
    assert st not in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and b.wall_hit


def test_a_pin_outside_the_default_domain_is_kept() -> None:
    # mbs is searched up to max_mbs = 8 by default; a pinned 16 (which divides the batch) wins
    s = SearchSpace.for_job(_job(), fix="mbs=16")
    assert s.mbs == (16,)


def test_best_for_key_builds_the_keys_own_tables() -> None:
    job = _job()
    space = SearchSpace.for_job(job, fix="tp=2,pp=2,vpp=1,cp=1,sp=1,zero=1,mbs=1,"
                                "recompute=full")
    t = build_tables(space)
    master = build_master(t)
    (_, key), *_ = enumerate_keys(master, None, 10**12)[0]
    own = best_for_key(space, key)
    shared = best_for_key(space, key, tables=t)
    assert own is not None and shared is not None
    assert own.plan == shared.plan and own.step_s == pytest.approx(shared.step_s, rel=1e-12)
    assert key_space(space, key).sp == (key.sp,)


def test_forbid_excludes_the_partition_just_found() -> None:
    job = _job()
    space = SearchSpace.for_job(job, fix="tp=2,pp=4,vpp=1,cp=1,sp=1,zero=1,mbs=1,"
                                "recompute=full", partial_recompute=True)
    t = build_tables(space)
    (_, key), *_ = enumerate_keys(build_master(t), None, 10**12)[0]
    pm = build_partition(t, key)
    assert pm is not None
    seen = []
    for _ in range(3):
        solver = cp_model.CpSolver()
        assert solver.solve(pm.model) == cp_model.OPTIMAL
        got = ([int(solver.value(x)) for x in pm.layers], int(solver.value(pm.r)))
        assert got not in seen
        seen.append(got)
        pm.forbid(solver)


def test_recommendation_keeps_the_pins() -> None:
    # tp=2 and ZeRO-3 add complexity (2 + 4); without the pins phase two would drop them
    job = _job()
    fix = "tp=2,zero=3,pp=1,cp=1,vpp=1"
    res = api.solve(job, top_k=3, time_limit=10, workers=1, fix=fix)
    # the master's root bound is a lower bound of the best step time (both in seconds)
    assert 0 < res.stats["root_bound_s"] <= res.plans[0].time.step_s
    ranked = [(e.plan, e.time.step_s) for e in res.plans]
    rec = recommend(job, ranked, 0.5, fix=fix, time_limit=10, workers=1)
    assert rec.method == "cp-sat phase 2"
    assert rec.plan.tp == 2 and rec.plan.zero == 3


def test_complexity_terms_name_each_axis_most_costly_first() -> None:
    p = Plan(dp=2, tp=2, pp=2, zero=2, recompute="selective", sp=1, num_microbatches=4)
    # weights: tp 2, pp 2, ZeRO-2 1, selective 1 (sp costs nothing); ties keep axis order
    assert complexity_terms(p) == ["tensor parallelism (tp=2)", "pipeline parallelism (pp=2)",
                                   "ZeRO-2", "selective recompute"]
    q = Plan(dp=1, cp=2, ep=2, vpp=2, pp=2, zero=3, recompute="full", num_microbatches=4)
    # cp 4, ZeRO-3 4, vpp 3, full 3, pp 2, ep 2; whole-stage full recompute adds no term
    assert complexity_terms(q) == ["context parallelism (cp=2)", "ZeRO-3",
                                   "interleaved pipeline (vpp=2)", "full recompute",
                                   "pipeline parallelism (pp=2)", "expert parallelism (ep=2)"]
    assert complexity_terms(q.model_copy(update={"recompute_layers": 3}))[-1] \
        == "partial recompute (3 layers/stage)"
    assert complexity_terms(Plan(dp=8)) == []


def test_why_names_what_the_simpler_plan_avoids() -> None:
    fastest = Plan(dp=2, tp=2, cp=2, zero=3, recompute="full")
    simpler = Plan(dp=4, tp=2, zero=2, recompute="selective")
    # fastest: tp 2 + cp 4 + ZeRO-3 4 + full 3 = 13; simpler: tp 2 + ZeRO-2 1 + selective 1 = 4
    assert (complexity(fastest), complexity(simpler)) == (13, 4)
    rec = Recommendation(plan=simpler, step_s=1.02, fastest=fastest, fastest_step_s=1.0,
                         tolerance=0.03, complexity=4, fastest_complexity=13, method="top-k")
    # cp is dropped (weight 4 -> 0); ZeRO and recompute only shrink (4 -> 1, 3 -> 1): "less"
    assert rec.why() == ("+2.0% step time for a simpler set-up (complexity 4 vs 13): avoids "
                         "context parallelism (cp=2), less ZeRO-3, less full recompute.")


def test_key_bound_is_exact_for_one_stage_without_recompute() -> None:
    # with pp = 1 and no recompute a key has one plan per node group: nothing to partition, no
    # recompute count to choose, T = S = the one stage's time, so the per-key bound must equal
    # that plan's exact step time (a bound that drops or flips a term is loose here); the MoE
    # model's first layer is dense, so the dense prefix's terms are in play
    job = Job(model=_mini(True, 4), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, fix="pp=1,recompute=none")
    t = build_tables(space)
    keys, _ = enumerate_keys(build_master(t), None, 10**12)
    assert len(keys) >= 12 and {k.zero for _, k in keys} >= {1, 2, 3}
    for _, k in keys:
        best = best_for_key(space, k, tables=t)
        assert best is not None
        assert key_bound(t, k) == pytest.approx(best.step_s, rel=1e-6)


def test_bad_pins_are_named_in_the_error() -> None:
    # a bad --fix value is a user's mistake: an error naming the pin (exit 2), never a traceback
    # or a search over a space the pin does not describe; gpt3-1.3b has 24 layers
    with pytest.raises(InputError) as err:
        SearchSpace.for_job(_job(), fix="recompute=full,recompute_layers=25")
    assert "recompute_layers=25: must be in 0..24" in str(err.value)
    with pytest.raises(UserError) as bad:
        SearchSpace.for_job(_job(), fix="tp=0")
    assert "tp" in str(bad.value)
