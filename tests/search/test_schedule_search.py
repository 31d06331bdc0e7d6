"""The pipeline schedule as a search axis (search/schedule_axis.py): `--fix schedule=X`
searches X only (1f1b, interleaved, gpipe; zb-h1 / zb-h2: test_zb_search.py), ZBV, DualPipe
and host offload are refused with exit 2, the proof's space names the schedules from the
space, the enumerator and CP-SAT agree on GPipe spaces, the master's and the keys' bounds stay
below every GPipe plan's exact cost, and pinning today's schedules changes no answer."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import (
    _assert_master_bounds,
    _compare_tol,
    _key,
    _mini,
    _ranked_or_raise,
)

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.errors import UserError
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster


def _job(moe: bool = False, layers: int = 8, gpus: int = 8, seq: int = 8192,
         batch: int = 16) -> Job:
    return Job(model=_mini(moe, layers), cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
               seq_len=seq, global_batch=batch)


def test_gpipe_pin_narrows_the_space_and_the_proof_names_it() -> None:
    job = _job()
    sp = SearchSpace.for_job(job, fix="schedule=gpipe", max_pp=4, max_vpp=2)
    assert sp.schedule == "gpipe" and sp.vpp == (1,) and min(sp.pp) > 1
    assert proof_space(sp)["schedule"] == ["gpipe"]
    assert "schedule gpipe" in space_line(proof_space(sp))
    assert proof_space(SearchSpace.for_job(job, max_pp=4, max_vpp=2))["schedule"] == [
        "1f1b", "interleaved"]
    union = job.model_copy(update={"search_also": ("schedule",)})
    default = SearchSpace.for_job(union, max_pp=4, max_vpp=2)
    # --search-also schedule: the union of the default and the zero-bubble schedules (the V
    # ones where vpp 2 is searched: search/replay_axis.py)
    assert proof_space(default)["schedule"] == ["1f1b", "interleaved", "zb-h1", "zb-h2", "zbv",
                                                "dualpipev"]
    assert proof_space(SearchSpace.for_job(union, max_vpp=1))["schedule"] == [
        "1f1b", "zb-h1", "zb-h2"]
    assert proof_space(SearchSpace.for_job(union, max_vpp=2, emit="megatron"))["schedule"] == [
        "1f1b", "interleaved"]
    inter = SearchSpace.for_job(job, fix="schedule=interleaved", max_pp=4, max_vpp=3)
    assert inter.vpp == (2, 3) and min(inter.pp) > 1 and inter.schedule == "interleaved"


@pytest.mark.parametrize("fix, match", [
    ("schedule=dualpipe,pp=1", "pp=1"),
    ("schedule=nope", "expected one of"),
    ("optimizer_offload=1.5", "at most 1"),
    ("activation_offload=99", "layer count in 0..8"),
    ("schedule=gpipe,pp=1", "pp=1"),
    ("schedule=gpipe,vpp=2", "vpp=2"),
])
def test_unsearched_pins_are_input_errors(fix: str, match: str) -> None:
    with pytest.raises(UserError, match=match):  # exit 2 (InputError, PlanError)
        SearchSpace.for_job(_job(), fix=fix, max_pp=4)


def test_outside_reads_the_schedule_from_the_space() -> None:
    job = _job()
    gp = SearchSpace.for_job(job, fix="schedule=gpipe", max_pp=4, max_vpp=2)
    best = enumerate_plans(job, gp, top_k=1).plans[0].plan
    assert best.schedule == "gpipe" and outside(gp, best) is None
    default = SearchSpace.for_job(job, max_pp=4, max_vpp=2)
    assert "schedule=gpipe" in (outside(default, best) or "")
    one = best.model_copy(update={"schedule": None})
    assert outside(default, one) is None
    assert "schedule=1f1b (searched: gpipe)" in (outside(gp, one) or "")


def test_gpipe_plans_cost_what_evaluate_says_and_never_beat_1f1b() -> None:
    """The searched GPipe plans carry the schedule, their table cost equals evaluate's (step
    and every stage's charged bytes: all m micro-batches in flight), and the best GPipe plan
    is no faster than the best 1F1B one (same bubble, more memory: cost/schedules.py)."""
    job = _job(seq=16384)
    gp = SearchSpace.for_job(job, fix="schedule=gpipe", max_pp=4, max_vpp=1, max_mbs=2)
    res = enumerate_plans(job, gp, top_k=5)
    t = build_tables(gp)
    for ev in res.plans:
        p = ev.plan
        assert p.schedule == "gpipe"
        pc = plan_cost(t, p)
        e = evaluate(job, p)
        assert pc.step_s == pytest.approx(e.time.step_s, rel=1e-9)
        assert list(pc.stage_charged) == pytest.approx(
            [s.charged_bytes for s in stage_memory(job, p)], rel=1e-9)
        as_1f1b = stage_memory(job, p.model_copy(update={"schedule": None}))
        if p.num_microbatches > 1:
            assert stage_memory(job, p)[-1].activations_bytes > as_1f1b[-1].activations_bytes
    one = enumerate_plans(job, SearchSpace.for_job(job, fix="schedule=1f1b", max_pp=4,
                                                   max_vpp=1, max_mbs=2), top_k=1)
    assert one.plans[0].time.step_s <= res.plans[0].time.step_s + 1e-12


def test_pinning_todays_schedules_changes_no_answer() -> None:
    """--fix schedule=1f1b is --fix vpp=1; --fix schedule=interleaved is today's vpp > 1 plans
    with pp > 1: same plans (no schedule field written), same costs, same order."""
    job = _job(layers=8)
    kw = {"max_pp": 4, "max_vpp": 2, "max_mbs": 2, "zero": (1,)}
    # the union's default sub-space (schedule_axis.py): today's space
    base = SearchSpace.for_job(job, **kw).schedule_variants()[0]
    assert base.schedules == (None,)
    ranked = _ranked_or_raise(job, base)
    a = enumerate_plans(job, SearchSpace.for_job(job, fix="schedule=1f1b", **kw), top_k=10**6)
    b = enumerate_plans(job, SearchSpace.for_job(job, fix="schedule=interleaved", **kw),
                        top_k=10**6)
    want_a = [(c, p.key()) for c, p in ranked if p.vpp == 1]
    want_b = [(c, p.key()) for c, p in ranked if p.vpp > 1]
    assert [(c, p.key()) for c, p in a.stats["ranked"]] == want_a
    assert [(c, p.key()) for c, p in b.stats["ranked"]] == want_b
    assert all(p.schedule is None for _, p in ranked)


def test_key_bounds_stay_below_every_gpipe_plan() -> None:
    """key_bound(key) <= the exact cost of every GPipe plan of the key, and the master's LB
    too (schedule_axis.py docstring: the same bubble, f_j = m >= 1 on every stage)."""
    job = _job(moe=True, layers=6, seq=8192)
    gp = SearchSpace.for_job(job, fix="schedule=gpipe", max_pp=4, max_vpp=1, max_mbs=2)
    t = build_tables(gp)
    ranked = _ranked_or_raise(job, gp)
    assert ranked
    for cost, plan in ranked[::3]:
        assert key_bound(t, _key(plan)) <= cost + 1e-9, plan.short()
    _assert_master_bounds(job, gp, 5)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=8, gpus=8, batch=32, seq=32768)  # memory-tight: m in flight binds
@given(moe=st.booleans(), layers=st.sampled_from([4, 6, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16, 32]), seq=st.sampled_from([2048, 8192, 32768]))
def test_gpipe_matches_enumeration(moe: bool, layers: int, gpus: int, batch: int,
                                   seq: int) -> None:
    """CP-SAT's top k equals the enumerator's on random GPipe spaces."""
    job = _job(moe, layers, gpus, seq, batch)
    space = SearchSpace.for_job(job, fix="schedule=gpipe", max_pp=4, max_vpp=1, max_mbs=2,
                                zero=(0, 1))
    if space.num_degree_combinations() == 0:
        return
    a = _compare_tol(job, space, 4)
    assert all(ev.plan.schedule == "gpipe" for ev in a.plans)


def test_gpipe_memory_binds_and_every_ranked_plan_fits() -> None:
    """On a memory-tight job all m micro-batches in flight rule out plans 1F1B runs: fewer
    GPipe plans fit than 1F1B ones of the same degrees, and every GPipe plan the enumerator
    ranks fits and costs what evaluate says (its in-flight count is GPipe's, not 1F1B's)."""
    job = _job(seq=32768, batch=32)
    kw = {"max_pp": 4, "max_vpp": 1, "max_mbs": 2, "zero": (1,), "partial_recompute": False}
    gp = enumerate_plans(job, SearchSpace.for_job(job, fix="schedule=gpipe", **kw),
                         top_k=10**6).stats["ranked"]
    ones = [p for _, p in enumerate_plans(job, SearchSpace.for_job(job, fix="schedule=1f1b",
                                                                   **kw),
                                          top_k=10**6).stats["ranked"] if p.pp > 1]
    assert 0 < len(gp) < len(ones)
    for cost, p in gp:
        ev = evaluate(job, p)
        assert ev.fits, p.short()
        assert cost == pytest.approx(ev.time.step_s, rel=1e-9)


def test_a_pinned_schedule_the_framework_does_not_run_is_refused() -> None:
    """`--emit megatron` (or `--emit deepspeed`) with --fix schedule=gpipe: exit 2 naming the
    framework's row; torchtitan runs GPipe (spec/frameworks.py RUNS_SCHEDULES), so its
    recipe's search returns GPipe plans."""
    from autoparallel_cp.spec import RECIPES

    job = _job()
    with pytest.raises(UserError, match="megatron does not run it"):
        SearchSpace.for_job(job, fix="schedule=gpipe", max_pp=4, emit="megatron")
    ds = job.model_copy(update={"recipe": RECIPES["deepspeed"]})
    with pytest.raises(UserError, match="deepspeed does not run it"):
        SearchSpace.for_job(ds, fix="schedule=gpipe", max_pp=4, emit="deepspeed")
    tt = job.model_copy(update={"recipe": RECIPES["torchtitan-fsdp"]})
    sp = SearchSpace.for_job(tt, fix="schedule=gpipe", max_pp=4, max_mbs=2)
    assert sp.restriction is not None
    res = enumerate_plans(tt, sp, top_k=2)
    assert all(ev.plan.schedule == "gpipe" for ev in res.plans)
    # Megatron runs interleaved: the pin stays a plain search there
    assert SearchSpace.for_job(job, fix="schedule=interleaved", max_pp=4,
                               emit="megatron").schedule == "interleaved"
