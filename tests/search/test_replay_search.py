"""ZBV and DualPipeV as searched schedules (search/replay_axis.py): `--fix schedule=zbv` /
`dualpipev` search V plans only (vpp 2, the named layouts, DualPipeV m >= 2pp); their table
cost equals evaluate's (the head on rank 0, the replayed bubble, the in-flight counts); the
replayed bubble is no per-key ratio (why the bounds take rho' = 0); every bound stays below
every V plan; CP-SAT equals the enumerator on random V spaces, exactly (no model rounds them);
the proof names the subset searched; DualPipeV on a MoE model is scored by the cost model
(search/model_scored.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import (
    _assert_master_bounds,
    _key,
    _mini,
    _mixed_small,
    _ranked_or_raise,
)
from test_zb_search import _job

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.steptime import stage_times
from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.search import replay_axis, schedule_axis
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.plan import Plan

V = ("zbv", "dualpipev")  # (`_job`: the ZB tests' small jobs)


@pytest.mark.parametrize("sched", V)
def test_a_v_pin_narrows_the_space_and_the_proof_names_it(sched: str) -> None:
    job = _job()
    sp = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_vpp=4)
    assert sp.schedule == sched and sp.vpp == (2,) and min(sp.pp) > 1
    assert not sp.partial_recompute  # the split's replayed share: all layers or a pinned count
    assert SearchSpace.for_job(job, fix=f"schedule={sched},recompute_layers=1",
                               max_pp=4).partial_recompute
    # one node group: the free per-rank family (search/cpsat_replay.py), then the named
    # layouts, each a pinned layout (tests/search/test_replay_free_split.py)
    fams = sp.split_families(4, 2)
    assert sp.free_ok(4, 2) and fams[0] is sp and all(f.fixed_split for f in fams[1:])
    line = space_line(proof_space(sp))
    assert f"schedule {sched}" in line and f"under {sched}: per rank" in line
    least = 2 * 4 if sched == "dualpipev" else 4
    assert all(d.num_microbatches >= (2 if sched == "dualpipev" else 1) * d.pp
               for d in sp.degrees())
    assert any(d.pp == 4 and d.num_microbatches == least for d in sp.degrees()) or all(
        d.pp < 4 for d in sp.degrees())
    best = enumerate_plans(job, sp, top_k=1).plans[0].plan
    assert best.schedule == sched and best.vpp == 2 and outside(sp, best) is None
    # a free split is inside the space; an odd rank count is not, and says why
    if best.pp == 2:
        assert outside(sp, best.model_copy(update={"stage_layers": (6, 2),
                                                   "chunk_layers": None})) is None
        assert "multiples of vpp" in (outside(sp, best.model_copy(
            update={"stage_layers": (5, 3), "chunk_layers": None})) or "")


def test_v_pins_outside_their_rules_are_input_errors() -> None:
    with pytest.raises(UserError, match="vpp"):
        SearchSpace.for_job(_job(), fix="schedule=zbv,vpp=1", max_pp=4)
    with pytest.raises(UserError, match="pp"):
        SearchSpace.for_job(_job(), fix="schedule=dualpipev,pp=1", max_pp=4)
    # DualPipeV on a MoE model is searched (its keys scored by the cost model,
    # search/model_scored.py), DualPipe too (tests/search/test_dualpipe_search.py)
    assert SearchSpace.for_job(_job(moe=True, layers=6), fix="schedule=dualpipev",
                               max_pp=4).schedule == "dualpipev"
    # Megatron does not run them (spec/frameworks.py), torchtitan does
    with pytest.raises(UserError, match="megatron does not run it"):
        SearchSpace.for_job(_job(), fix="schedule=zbv", max_pp=4, emit="megatron")
    tt = _job().model_copy(update={"recipe": RECIPES["torchtitan-fsdp"]})
    assert SearchSpace.for_job(tt, fix="schedule=dualpipev", max_pp=4).schedule == "dualpipev"


@pytest.mark.parametrize("sched, moe, fix", [
    ("zbv", False, ""), ("zbv", True, ""), ("dualpipev", False, ""),
    ("zbv", False, ",recompute=full,recompute_layers=1"),
])
def test_v_plans_cost_what_evaluate_says(sched: str, moe: bool, fix: str) -> None:
    """plan_cost == evaluate (step and every stage's charged bytes) for every ranked V plan,
    the LM head on rank 0 (cost/schedules.py `head_stage`) and the replayed bubble."""
    job = _job(moe=moe, layers=6 if moe else 8, seq=8192)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched}{fix}", max_pp=4, max_mbs=2)
    t = build_tables(sp)
    ranked = _ranked_or_raise(job, sp)
    assert ranked
    for cost, p in ranked[::2]:
        assert p.schedule == sched and p.vpp == 2
        pc = plan_cost(t, p)
        e = evaluate(job, p)
        assert pc.step_s == pytest.approx(e.time.step_s, rel=1e-9)
        assert cost == pytest.approx(e.time.step_s, rel=1e-9)
        assert list(pc.stage_charged) == pytest.approx(
            [s.charged_bytes for s in stage_memory(job, p)], rel=1e-9)
        assert list(pc.stage_time_s) == pytest.approx(
            [s.total_s for s in stage_times(job, p)], rel=1e-9)
    assert replay_axis.head_position(sched, 4) == 0
    assert replay_axis.head_position("zb-h1", 4) == replay_axis.head_position(None, 4) == 3


@pytest.mark.parametrize("sched, want", [("zbv", 1 / 6), ("dualpipev", 1 / 3)])
@pytest.mark.parametrize("p", [2, 4])
def test_the_replayed_bubble_hand_derived_and_why_no_ratio(
        monkeypatch: pytest.MonkeyPatch, sched: str, want: float, p: int) -> None:
    """Equal ranks of time t, F = B = W: each V chunk runs t/6 per pass. DualPipeV's bubble
    is DeepSeek-V3's (p-1)(F&B + B - 3W) over chunks (2412.19437 Table 2; F&B = F + B with
    the full backward B = I + W): (p-1)(3 + 2 - 3)·t/6 = (p-1)·t/3; torch's ZBV without
    post-validation keeps the (p-1)-chunk forward ramp: (p-1)·t/6 (cost/schedules.py). With
    rank 0 slower the others' ramps hide behind it and the bubble is 0 at the same S - T: no
    constant ratio of S - T describes it, so the bounds take rho' = 0 (replay_axis.py)."""
    monkeypatch.setattr(replay_axis, "key_split", lambda *a: (1 / 3, 1 / 3, 1 / 3))
    sp = SearchSpace.for_job(_job(), fix=f"schedule={sched}", max_pp=4)
    m = 8 * p
    eq = replay_axis.bubble(sp, p, 1, 1, 1, 0, 1, "none", None, m, [1.0] * p)
    assert eq == pytest.approx(want * (p - 1), rel=1e-12)
    # rank 0 (in a V the one with the embedding and the head) twice as slow: S - T is the
    # same p - 1, and every other rank's ramp hides behind rank 0's work: no bubble
    slow = replay_axis.bubble(sp, p, 1, 1, 1, 0, 1, "none", None, m, [2.0] + [1.0] * (p - 1))
    assert slow == pytest.approx(0.0, abs=1e-9)
    # the last rank slow: its own (p - 1)-chunk forward ramp is still waited for
    last = replay_axis.bubble(sp, p, 1, 1, 1, 0, 1, "none", None, m, [1.0] * (p - 1) + [2.0])
    assert last == pytest.approx((p - 1) / 6, rel=1e-9)


@pytest.mark.parametrize("sched, moe", [("zbv", True), ("dualpipev", False)])
def test_every_bound_stays_below_every_v_plan(sched: str, moe: bool) -> None:
    """key_bound (uncoupled and coupled), the key listing's LB and the master's LB <= the
    exact cost of every V plan of the key (replay_axis.py: rho' = 0, the head on rank 0)."""
    job = _job(moe=moe, layers=6 if moe else 8, seq=8192)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_mbs=2)
    t = build_tables(sp)
    ranked = _ranked_or_raise(job, sp)
    assert ranked
    kt = build_key_table(t)
    lbs = {kt.key(i): int(kt.lb[i]) * kt.unit_s for i in range(len(kt.lb))}
    for cost, plan in ranked[::3]:
        k = _key(plan)
        assert key_bound(t, k) <= cost + 1e-9, plan.short()
        assert key_bound(t, k, coupled=True) <= cost + 1e-9, plan.short()
        assert lbs[k] <= cost + 1e-9, plan.short()
        assert schedule_axis.key_ratio(sp, k.pp, k.tp, k.cp, k.ep, k.mbs, k.mode, k.sp,
                                       k.m) == 0.0
    _assert_master_bounds(job, sp, 5)


def _compare_exact(job: Job, space: SearchSpace, k: int) -> None:
    """CP-SAT's top k equals the enumerator's exactly: every V key is scanned, no model."""
    try:
        b = _ranked_or_raise(job, space)[:k]  # shared with `_assert_master_bounds`
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve(job, space, top_k=k, time_limit=120)
        return
    a = solve(job, space, top_k=k, time_limit=120)
    assert a.status == "optimal" and a.error_bound_s == 0.0
    assert [c for c, _ in a.stats["ranked"]] == [c for c, _ in b]
    assert [p.key()[:10] for _, p in a.stats["ranked"]] == [p.key()[:10] for _, p in b]
    for ev in a.plans:
        assert ev.fits and ev.plan.schedule == space.schedule
        assert ev.time.step_s == pytest.approx(evaluate(job, ev.plan).time.step_s, rel=1e-9)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@example(sched="zbv", moe=True, layers=6, gpus=8, batch=16, seq=8192, zero="0,1")
@example(sched="dualpipev", moe=False, layers=8, gpus=8, batch=32, seq=32768, zero="1,3")
@given(sched=st.sampled_from(V), moe=st.booleans(), layers=st.sampled_from([4, 6, 8]),
       gpus=st.sampled_from([4, 8]), batch=st.sampled_from([8, 16, 32]),
       seq=st.sampled_from([2048, 8192, 32768]), zero=st.sampled_from(["0,1", "1,3"]))
def test_v_spaces_match_enumeration(sched: str, moe: bool, layers: int, gpus: int, batch: int,
                                    seq: int, zero: str) -> None:
    job = _job(moe, layers, gpus, seq, batch)
    zs = tuple(int(z) for z in zero.split(","))
    try:
        space = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_mbs=2,
                                    zero=zs)
    except UserError:
        return  # no pp > 1 of this job (a pin outside the rules is exit 2)
    if space.num_degree_combinations() == 0:
        return
    _compare_exact(job, space, 4)


def test_a_heterogeneous_v_space_matches_enumeration() -> None:
    """Two node groups: the stage placement is scanned with the layout, exactly."""
    job = Job(model=_mini(False, 8), cluster=_mixed_small(), seq_len=4096, global_batch=32)
    space = SearchSpace.for_job(job, fix="schedule=zbv,tp=8", max_pp=4, max_mbs=1,
                                zero=(1,))
    _compare_exact(job, space, 4)


def test_zbv_removes_bubble_against_interleaving_on_the_same_plan() -> None:
    """The best ZBV plan against the same plan under interleaved 1F1B (vpp 2): a smaller
    bubble (the split backward fills the ramp), so a faster step. The split is pinned even:
    ZBV's best here leaves rank 0 empty (search/empty_rank.py), which interleaving refuses."""
    job = _job(layers=8, seq=8192, batch=8)
    sp = SearchSpace.for_job(
        job, fix="schedule=zbv,pp=4,tp=1,cp=1,mbs=1,recompute=none,stage_layers=2:2:2:2",
        max_pp=4)
    best = solve(job, sp, top_k=1, time_limit=60).plans[0]
    inter = evaluate(job, Plan(**{**best.plan.model_dump(), "schedule": None}))
    assert best.time.bubble_s < inter.time.bubble_s
    assert best.time.step_s < inter.time.step_s


@pytest.mark.parametrize("layers, batch", [(8, 16), (6, 32)])
def test_the_torchtitan_union_matches_enumeration_and_the_pinned_spaces(
        layers: int, batch: int) -> None:
    """torchtitan runs ZBV and DualPipeV (spec/frameworks.py): its --search-also schedule
    space is the default's and theirs; CP-SAT's top k equals the enumerator's, whose answer
    is the best per key over the spaces each pin searches."""
    from test_solver_vs_enumerate import _compare_tol

    job = _job(layers=layers, batch=batch).model_copy(update={
        "recipe": RECIPES["torchtitan-fsdp"], "search_also": ("schedule",)})
    kw: dict[str, Any] = {"max_pp": 4, "max_vpp": 2, "max_mbs": 2}
    space = SearchSpace.for_job(job, **kw)
    assert space.schedules == (None, "zbv", "dualpipev")
    _compare_tol(job, space, 4)
    ranked = _ranked_or_raise(job, space)
    best: dict[object, tuple[float, object]] = {}
    for v in space.schedule_variants():
        sub = v if v.schedule is None else SearchSpace.for_job(
            job, fix=f"schedule={v.schedule}", **kw)
        for c, p in _ranked_or_raise(job, sub):
            k = _key(p)
            if k not in best or (c, p.key()) < best[k]:
                best[k] = (c, p.key())
    assert [(c, p.key()) for c, p in ranked] == sorted(best.values())
    assert any(p.schedule in V for _, p in ranked)


def test_least_step_without_a_bubble_term_is_never_nan() -> None:
    """A replayed schedule's divisor is infinite (`schedule_axis.bubble_divisor`): no bubble
    term, also where no split fits (S infinite: the bound is infinite, not NaN, so the key
    heap stays ordered); finite S gives m·T + tail."""
    import numpy as np

    from autoparallel_cp.search.key_grid import least_step

    vdiv = np.array([np.inf, np.inf, 2.0])
    got = least_step(np.array([1.0, 1.0, 1.0]), np.array([3.0, np.inf, 3.0]), 4, vdiv,
                     np.array([8.0, 8.0, 8.0]), 0.0, 0.0, 0.5, 2 / 3)
    assert not np.isnan(got).any() and np.isinf(got[1])
    assert got[0] == pytest.approx(8.0 * 1.0 + 0.5)  # T = max(1, 3/4)
    assert got[2] == pytest.approx((8.0 - 0.5) * 1.0 + 3.0 / 2.0 + 0.5)
