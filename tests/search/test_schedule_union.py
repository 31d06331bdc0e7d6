"""The pipeline schedule searched by default (issue 31.1, search/schedule_axis.py): without
`--fix schedule` the space is the union of the default schedules (1f1b, interleaved) and
zb-h1 / zb-h2 where the frameworks run them; CP-SAT equals the enumerator on random unions,
the union's answer is the best of the pinned spaces' answers per key, the sub-spaces' bounds
stay below their plans, GPipe (pin-only) is dominated by 1F1B, and `explain`'s schedule
neighbours lie in the space."""

from __future__ import annotations

from typing import Any

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
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.neighbours import neighbours
from autoparallel_cp.search.solve import solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.loaders import load_cluster

UNION = ["1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev"]


def _job(moe: bool = False, layers: int = 8, gpus: int = 8, seq: int = 8192,
         batch: int = 16) -> Job:
    return Job(model=_mini(moe, layers), cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
               seq_len=seq, global_batch=batch, search_also=("schedule",))


def test_the_union_is_named_and_restricted_to_what_the_framework_runs() -> None:
    job = _job()
    sp = SearchSpace.for_job(job, max_pp=4, max_vpp=2)
    assert sp.schedules == (None, "zb-h1", "zb-h2", "zbv", "dualpipev") and sp.schedule is None
    assert proof_space(sp)["schedule"] == UNION
    assert "schedule 1f1b,interleaved,zb-h1,zb-h2,zbv,dualpipev" in space_line(proof_space(sp))
    assert sp.describe()["schedule"] == UNION
    # Megatron (--emit) runs none of them, torchtitan (recipe) the V-shaped ones only
    # (spec/frameworks.py RUNS_SCHEDULES); DualPipeV on a MoE model too, where it hides a
    # share of the EP all-to-all (schedule_axis.py `union_ok`, session 22)
    assert SearchSpace.for_job(job, max_pp=4, emit="megatron").schedules == (None,)
    tt = job.model_copy(update={"recipe": RECIPES["torchtitan-fsdp"]})
    assert SearchSpace.for_job(tt, max_pp=4).schedules == (None, "zbv", "dualpipev")
    assert SearchSpace.for_job(tt, max_pp=4, max_vpp=1).schedules == (None,)
    assert SearchSpace.for_job(_job(moe=True, layers=6), max_pp=4).schedules == (
        None, "zb-h1", "zb-h2", "zbv", "dualpipev")
    # no pp > 1: nothing for a schedule to run on; vpp 2 pinned: the V-shaped ones only
    assert SearchSpace.for_job(job, fix="pp=1").schedules == (None,)
    assert SearchSpace.for_job(job, fix="vpp=2", max_pp=4).schedules == (None, "zbv",
                                                                         "dualpipev")
    # a pin searches it alone, as before
    assert SearchSpace.for_job(job, fix="schedule=zb-h1", max_pp=4).schedules == ("zb-h1",)


def test_the_sub_spaces_are_the_pinned_spaces() -> None:
    """Each ZB sub-space is what --fix schedule=X searches (its domains and partial
    recompute), the default one is the space without ZB, and the union's size is theirs."""
    job = _job()
    kw = {"max_pp": 4, "max_vpp": 2, "max_mbs": 2}
    sp = SearchSpace.for_job(job, **kw)
    base, *zb = sp.schedule_variants()
    assert base.schedules == (None,) and base.vpp == sp.vpp and base.pp == sp.pp
    assert base.describe() == {**SearchSpace.for_job(job, emit=None, **kw).describe(),
                               "schedule": ["1f1b", "interleaved"]}
    total = base.size()
    for v in zb:
        pinned = SearchSpace.for_job(job, fix=f"schedule={v.schedule}", **kw)
        assert v.describe() == pinned.describe()
        assert v.size() == pinned.size() > 0
        total += v.size()
    assert sp.size() == total


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=8, gpus=8, batch=32, seq=32768)  # memory binds: ZB-H2's 2p - 1
@example(moe=True, layers=6, gpus=8, batch=16, seq=8192)
@given(moe=st.booleans(), layers=st.sampled_from([4, 6, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16, 32]), seq=st.sampled_from([2048, 8192, 32768]))
def test_the_union_matches_enumeration_and_the_pinned_spaces(
        moe: bool, layers: int, gpus: int, batch: int, seq: int) -> None:
    """CP-SAT's top k over the union equals the enumerator's, and the enumerator's union is
    the best per key over the spaces each schedule pin searches (the default's too)."""
    job = _job(moe, layers, gpus, seq, batch)
    kw = {"max_pp": 4, "max_vpp": 2, "max_mbs": 2, "zero": (0, 1)}
    space = SearchSpace.for_job(job, **kw)
    if space.num_degree_combinations() == 0:
        return
    try:
        ranked = _ranked_or_raise(job, space)
    except Exception as e:  # no plan fits: the solver must say so too
        from autoparallel_cp.errors import InfeasibleError

        assert isinstance(e, InfeasibleError)
        with pytest.raises(InfeasibleError):
            solve(job, space, top_k=4, time_limit=120)
        return
    _compare_tol(job, space, 4)
    best: dict[tuple[object, ...], tuple[float, tuple[object, ...]]] = {}
    for v in space.schedule_variants():
        fix = None if v.schedule is None else f"schedule={v.schedule}"
        sub = v if fix is None else SearchSpace.for_job(job, fix=fix, **kw)
        try:
            part = _ranked_or_raise(job, sub)
        except Exception:
            continue
        for c, p in part:
            k = _key(p)
            if k not in best or (c, p.key()) < best[k]:
                best[k] = (c, p.key())
    assert [(c, p.key()) for c, p in ranked] == sorted(best.values())


def test_the_union_beats_the_default_where_the_bubble_is_large_and_says_which() -> None:
    """A pipeline without interleaving (pp 4, vpp 1 pinned): a ZB plan is the proven optimum
    of the union, equal to the best of the --fix schedule=zb-h1 / zb-h2 solves, and faster
    than the default's (1F1B)."""
    job = _job(layers=8, gpus=8, seq=8192, batch=8)
    kw = {"max_pp": 4, "max_vpp": 2, "max_mbs": 1, "max_cp": 1}
    space = SearchSpace.for_job(job, fix="pp=4,tp=1,vpp=1", **kw)
    res = solve(job, space, top_k=3, time_limit=60)
    assert res.status == "optimal"
    top = res.plans[0]
    assert top.plan.schedule in ("zb-h1", "zb-h2")
    pins = [solve(job, SearchSpace.for_job(job, fix=f"pp=4,tp=1,vpp=1,schedule={s}", **kw),
                  top_k=1, time_limit=60).plans[0].time.step_s for s in ("zb-h1", "zb-h2")]
    default = solve(job, space.schedule_variants()[0], top_k=1, time_limit=60)
    assert top.time.step_s == pytest.approx(min(pins), rel=1e-12)
    assert top.time.step_s < default.plans[0].time.step_s
    assert outside(space, top.plan) is None


@pytest.mark.parametrize("sched", ["zb-h1", "zb-h2"])
def test_bounds_of_the_union_stay_below_its_zb_plans(sched: str) -> None:
    """The master's LB and key_bound of the ZB sub-space (its own tables) stay below every
    plan of it (the proof in schedule_axis.py: the union's bounds are the sub-spaces')."""
    job = _job(moe=True, layers=6)
    sp = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)
    sub = next(v for v in sp.schedule_variants() if v.schedule == sched)
    t = build_tables(sub)
    ranked = _ranked_or_raise(job, sub)
    assert ranked and all(p.schedule == sched for _, p in ranked)
    for cost, plan in ranked[::4]:
        assert key_bound(t, _key(plan)) <= cost + 1e-9, plan.short()
    _assert_master_bounds(job, sub, 5)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([4, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 32]), seq=st.sampled_from([2048, 16384]),
       pick=st.integers(0, 10**6))
def test_gpipe_is_dominated_by_1f1b(moe: bool, layers: int, gpus: int, batch: int, seq: int,
                                    pick: int) -> None:
    """Why GPipe stays pin-only (schedule_axis.py): a GPipe plan and the same plan under the
    default schedule take the same step time, and the default never needs more memory on any
    stage, so the union's best per key is the same with or without GPipe."""
    job = _job(moe, layers, gpus, seq, batch)
    gp = SearchSpace.for_job(job, fix="schedule=gpipe", max_pp=4, max_mbs=2, zero=(0, 1))
    if gp.num_degree_combinations() == 0:
        return
    try:
        ranked = _ranked_or_raise(job, gp)
    except Exception:
        return
    for _, p in (ranked[pick % len(ranked)], ranked[0]):
        one = p.model_copy(update={"schedule": None})
        a, b = evaluate(job, p), evaluate(job, one)
        assert a.time.step_s == pytest.approx(b.time.step_s, rel=1e-12)
        for sg, s1 in zip(stage_memory(job, p), stage_memory(job, one), strict=True):
            assert s1.charged_bytes <= sg.charged_bytes * (1 + 1e-12)
        assert one.key() < p.key()  # the default wins an exact tie


def test_schedule_neighbours_of_a_proven_optimum_lie_in_the_union_and_do_not_beat_it() -> None:
    """`explain`'s schedule changes of a proven pp > 1 optimum: the ZB ones are inside the
    union now (space_proof.outside), and none of them that fits beats it."""
    job = _job(layers=8, gpus=8, seq=8192, batch=8)
    space = SearchSpace.for_job(job, fix="pp=4,tp=1,vpp=1", max_pp=4, max_vpp=2, max_mbs=1,
                                max_cp=1)
    res = solve(job, space, top_k=1, time_limit=60)
    assert res.status == "optimal"
    best = res.plans[0]
    changes = [(label, p) for label, p in neighbours(job, best.plan) if "schedule" in label]
    inside = [(label, p) for label, p in changes if outside(space, p) is None]
    assert {p.pipeline_schedule for _, p in inside} >= {"1f1b", "zb-h1", "zb-h2"} - {
        best.plan.pipeline_schedule}
    for label, p in inside:
        ev = evaluate(job, p)
        assert not ev.fits or ev.time.step_s >= best.time.step_s * (1 - 1e-9), label
    gpipe = [p for _, p in changes if p.pipeline_schedule == "gpipe"]
    assert gpipe and all("schedule=gpipe" in (outside(space, p) or "") for p in gpipe)


def test_the_readme_job_picks_zbv_and_says_which_bubble_it_removes(tmp_path: Any) -> None:
    """The README job with --search-also schedule: #1 is ZBV (the --fix schedule=zbv
    optimum), a ZB-H1 plan (the --fix schedule=zb-h1 optimum) is among the top 3, the table
    names the schedule, the report says which bubble ZBV removes against interleaved 1F1B on
    the same plan, and --emit megatron (neither schedule) keeps the default ones; the default
    search (no --search-also) covers 1f1b and interleaved only."""
    import json

    from click.testing import CliRunner

    from autoparallel_cp.cli import main

    job = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--seq-len",
           "8192", "--global-batch", "512", "--top-k", "3"]

    def run(*extra: str) -> tuple[dict[str, Any], str]:
        out = tmp_path / "s.json"
        r = CliRunner().invoke(main, ["solve", *job, "--json", str(out), *extra])
        assert r.exit_code == 0, r.output
        return json.loads(out.read_text()), r.stdout

    data, text = run("--search-also", "schedule")
    top = data["plans"][0]
    assert data["status"] == "optimal" and data["space"]["schedule"] == UNION
    assert top["plan"]["schedule"] == "zbv" and top["plan"]["vpp"] == 2
    assert "sched" in text and "schedule zbv: bubble" in text
    assert "against interleaved on the same plan" in text
    pinned, _ = run("--fix", "schedule=zbv")
    assert top["time"]["step_s"] == pytest.approx(pinned["plans"][0]["time"]["step_s"],
                                                  rel=1e-12)
    zb, _ = run("--fix", "schedule=zb-h1")
    second = next(p for p in data["plans"] if p["plan"]["schedule"] == "zb-h1")
    assert second["time"]["step_s"] == pytest.approx(zb["plans"][0]["time"]["step_s"],
                                                     rel=1e-12)
    plain, _ = run()
    assert plain["space"]["schedule"] == ["1f1b", "interleaved"]
    assert plain["plans"][0]["time"]["step_s"] > top["time"]["step_s"]
    mg, _ = run("--search-also", "schedule", "--emit", "megatron")
    assert mg["space"]["schedule"] == ["1f1b", "interleaved"]
    assert all(p["plan"].get("schedule") is None for p in mg["plans"])
    assert mg["plans"][0]["time"]["step_s"] > top["time"]["step_s"]


def test_rho_zero_master_past_the_split_budget_stays_exact(monkeypatch: Any) -> None:
    """Past `FAMILY_SPLITS_MAX` the ZB sub-spaces' master takes rho' = 0 (schedule_axis.py
    `_exact_families`): its LB stays below every plan and the union's answer is unchanged."""
    from autoparallel_cp.search import schedule_axis

    job = _job(moe=True, layers=6)
    kw = {"max_pp": 4, "max_vpp": 2, "max_mbs": 2, "zero": (0, 1)}
    want = solve(job, SearchSpace.for_job(job, **kw), top_k=4, time_limit=60).stats["ranked"]
    monkeypatch.setattr(schedule_axis, "FAMILY_SPLITS_MAX", 0)
    space = SearchSpace.for_job(job, **kw)
    sub = space.schedule_variants()[1]
    assert sub.schedule == "zb-h1"
    assert schedule_axis.family_ratio([sub], 1, 1, 1, 2) == 0.0
    _assert_master_bounds(job, space, 5)
    got = _compare_tol(job, space, 4).stats["ranked"]
    assert [(c, p.key()) for c, p in got] == [(c, p.key()) for c, p in want]
