"""Zero-bubble schedules as a search axis (search/schedule_axis.py): `--fix schedule=zb-h1` /
`zb-h2` search those plans only; their table cost equals evaluate's (the bubble ratio of the
plan's F/B/W split, the in-flight counts), CP-SAT equals the enumerator on random ZB spaces,
(tests/search/test_solver_vs_enumerate.py), the master's and the keys' bounds stay below
every ZB plan, the proof names the schedule,
and a ZB schedule beats 1F1B where the bubble is large."""

from __future__ import annotations

import pytest
from test_solver_vs_enumerate import _assert_master_bounds, _key, _mini, _ranked_or_raise

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.pass_split import backward_split
from autoparallel_cp.cost.schedules import bubble_ratio
from autoparallel_cp.errors import UserError
from autoparallel_cp.search.key_bounds import key_bound, key_coefs
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.schedule_axis import family_ratio, key_ratio
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space, space_line
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.plan import RECOMPUTE_MODES

ZB = ("zb-h1", "zb-h2")


def _job(moe: bool = False, layers: int = 8, gpus: int = 8, seq: int = 8192,
         batch: int = 16) -> Job:
    return Job(model=_mini(moe, layers), cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
               seq_len=seq, global_batch=batch)


@pytest.mark.parametrize("sched", ZB)
def test_zb_pin_narrows_the_space_and_the_proof_names_it(sched: str) -> None:
    job = _job()
    sp = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_vpp=2)
    assert sp.schedule == sched and sp.vpp == (1,) and min(sp.pp) > 1
    # the split depends on a free partial-recompute count: all layers or a pinned count
    assert not sp.partial_recompute
    pinned = SearchSpace.for_job(job, fix=f"schedule={sched},recompute_layers=1", max_pp=4)
    assert pinned.partial_recompute
    assert proof_space(sp)["schedule"] == [sched]
    assert f"schedule {sched}" in space_line(proof_space(sp))
    best = enumerate_plans(job, sp, top_k=1).plans[0].plan
    assert best.schedule == sched and outside(sp, best) is None
    # --search-also schedule searches the union (schedule_axis.py): the plan lies in it, and
    # not in the default space nor in one whose framework does not run ZB (--emit megatron)
    union = job.model_copy(update={"search_also": ("schedule",)})
    assert outside(SearchSpace.for_job(union, max_pp=4), best) is None
    assert "--search-also schedule" in (outside(SearchSpace.for_job(job, max_pp=4), best) or "")
    assert f"schedule={sched}" in (
        outside(SearchSpace.for_job(union, max_pp=4, emit="megatron"), best) or "")


@pytest.mark.parametrize("fix, match", [
    ("schedule=zb-h1,pp=1", "pp=1"),
    ("schedule=zb-h2,vpp=2", "vpp=2"),
    ("schedule=dualpipe,pp=1", "pp=1"),
])
def test_zb_pins_outside_their_rules_are_input_errors(fix: str, match: str) -> None:
    with pytest.raises(UserError, match=match):
        SearchSpace.for_job(_job(), fix=fix, max_pp=4)


def test_megatron_and_torchtitan_do_not_run_zb_h1() -> None:
    """spec/frameworks.py: neither lists ZB-H1 / ZB-H2 (Qi et al.'s own Megatron fork runs
    them): a pin with their recipe or --emit is exit 2 naming the framework."""
    from autoparallel_cp.spec import RECIPES

    job = _job()
    with pytest.raises(UserError, match="megatron does not run it"):
        SearchSpace.for_job(job, fix="schedule=zb-h1", max_pp=4, emit="megatron")
    tt = job.model_copy(update={"recipe": RECIPES["torchtitan-fsdp"]})
    with pytest.raises(UserError, match="torchtitan does not run it"):
        SearchSpace.for_job(tt, fix="schedule=zb-h2", max_pp=4)


@pytest.mark.parametrize("sched", ZB)
@pytest.mark.parametrize("moe", [False, True])
def test_zb_plans_cost_what_evaluate_says(sched: str, moe: bool) -> None:
    """plan_cost == evaluate (step and every stage's charged bytes) for the ranked ZB plans,
    and the key's rho is the plan's own bubble ratio (cost/schedules.py)."""
    job = _job(moe=moe, layers=6 if moe else 8, seq=8192)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_mbs=2)
    t = build_tables(sp)
    ranked = _ranked_or_raise(job, sp)
    assert ranked
    for cost, p in ranked[::2]:
        assert p.schedule == sched
        pc = plan_cost(t, p)
        e = evaluate(job, p)
        assert pc.step_s == pytest.approx(e.time.step_s, rel=1e-9)
        assert cost == pytest.approx(e.time.step_s, rel=1e-9)
        assert list(pc.stage_charged) == pytest.approx(
            [s.charged_bytes for s in stage_memory(job, p)], rel=1e-9)
        want = bubble_ratio(sched, p.pp, backward_split(job, p), p.num_microbatches)
        tv = next((v for v in t.variants if v.space.etp == p.etp), t)
        rho = key_ratio(tv.space, p.pp, p.tp, p.cp, p.ep, p.mbs,
                        RECOMPUTE_MODES.index(p.recompute), p.sp, p.num_microbatches)
        assert rho == pytest.approx(want, rel=1e-12) and 0.0 < rho < 1.0


@pytest.mark.parametrize("sched", ZB)
def test_key_bounds_stay_below_every_zb_plan(sched: str) -> None:
    """key_bound(key) (uncoupled and coupled) <= the exact cost of every ZB plan of the key,
    the key listing's LB too, and the master's LB (schedule_axis.py docstring)."""
    job = _job(moe=True, layers=6, seq=8192)
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
        fam = family_ratio([v.space for v in t.variants] or [sp], k.tp, k.cp, k.mbs, k.pp)
        assert fam <= key_ratio(sp, k.pp, k.tp, k.cp, k.ep, k.mbs, k.mode, k.sp, k.m) + 1e-15
    _assert_master_bounds(job, sp, 5)


def test_zb_bound_is_tighter_than_1f1bs() -> None:
    """The ZB key bound uses the key's rho: below the exact ZB cost, and below the 1F1B bound
    of the same key (a smaller bubble), which it would not be with rho = 1."""
    job = _job(layers=8, seq=8192, batch=8)
    zb = SearchSpace.for_job(job, fix="schedule=zb-h1,pp=4,tp=1,cp=1,mbs=1,recompute=none",
                             max_pp=4)
    one = SearchSpace.for_job(job, fix="schedule=1f1b,pp=4,tp=1,cp=1,mbs=1,recompute=none",
                              max_pp=4)
    rz = _ranked_or_raise(job, zb)
    ro = _ranked_or_raise(job, one)
    tz, to = build_tables(zb), build_tables(one)
    for (cz, pz), (co, po) in zip(rz, ro, strict=False):
        k = _key(pz)
        assert key_bound(tz, k) <= cz + 1e-9
        assert key_bound(tz, k) < key_bound(to, k)
        assert cz < co or pz.key() != po.key()


def test_zb_beats_1f1b_where_the_bubble_is_large() -> None:
    """Few micro-batches per pipeline (m = pp): 1F1B's bubble is (pp-1)/m of the step, ZB-H1
    removes most of it at 1F1B's memory (ZB-H1 holds min(p, m) = 1F1B's stage-0 count), so
    the best ZB-H1 plan of the same degrees is faster, by its bubble difference."""
    job = _job(layers=8, seq=4096, batch=8)
    kw = {"max_pp": 4}
    fix = "pp=4,tp=1,cp=1,dp=2,mbs=1,zero=1,recompute=none"
    zb = enumerate_plans(job, SearchSpace.for_job(job, fix=f"schedule=zb-h1,{fix}", **kw),
                         top_k=1).plans[0]
    one = enumerate_plans(job, SearchSpace.for_job(job, fix=f"schedule=1f1b,{fix}", **kw),
                          top_k=1).plans[0]
    assert zb.plan.num_microbatches == one.plan.num_microbatches == 4
    assert zb.time.bubble_s < 0.7 * one.time.bubble_s
    assert zb.time.step_s == pytest.approx(
        one.time.step_s - (one.time.bubble_s - zb.time.bubble_s), rel=1e-6)


@pytest.mark.parametrize("recipe", ["megatron-bf16", "torchtitan-fsdp"])
def test_default_search_is_unchanged_by_the_zb_axis(recipe: str) -> None:
    """Without a pin, a framework's space keeps the default schedules (no framework row runs
    ZB-H1 / ZB-H2: spec/frameworks.py; Megatron's by --emit megatron, torchtitan's by its
    recipe), its keys' rho is exactly 1 and their bubble divisor exactly vpp (so every bound
    and cost is today's float), and no plan carries a schedule."""
    from autoparallel_cp.spec import RECIPES

    job = _job().model_copy(update={"recipe": RECIPES[recipe]})
    sp = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2,
                             emit="megatron" if recipe == "megatron-bf16" else None)
    assert sp.schedules == (None,)
    assert sp.schedule is None and sp.partial_recompute == (recipe == "megatron-bf16")
    assert proof_space(sp)["schedule"] == ["1f1b", "interleaved"]
    t = build_tables(sp)
    ranked = _ranked_or_raise(job, sp)
    assert ranked and all(p.schedule is None for _, p in ranked)
    for _, p in ranked[::5]:
        k = _key(p)
        tv = next((v for v in t.variants if v.space.etp == p.etp), t)
        assert key_ratio(tv.space, k.pp, k.tp, k.cp, k.ep, k.mbs, k.mode, k.sp, k.m) == 1.0
        assert key_coefs(tv, k).vdiv == float(k.vpp)
        assert plan_cost(t, p).step_s == pytest.approx(evaluate(job, p).time.step_s, rel=1e-9)


@pytest.mark.parametrize("pp, m", [(2, 1), (2, 4), (4, 3), (4, 8), (8, 16)])
def test_the_searched_in_flight_counts_are_the_papers(pp: int, m: int) -> None:
    """Qi et al. (arXiv 2401.10241) Table 1: ZB-H1 keeps 1F1B's peak, p micro-batches, on
    every stage (1F1B: p - j on stage j); ZB-H2 2p - 1 on every stage; both capped at m. The
    search reads them per stage (schedule_axis.inflight / stage_inflight), hand-derived here."""
    from autoparallel_cp.search.schedule_axis import inflight, stage_inflight

    for j in range(pp):
        assert inflight(None, pp, 1, m, j) == min(pp - j, m)
        assert inflight("zb-h1", pp, 1, m, j) == min(pp, m)
        assert inflight("zb-h2", pp, 1, m, j) == min(2 * pp - 1, m)
        assert stage_inflight("zb-h1", pp, 1, m, j, (3,)) == min(pp, m)
        assert stage_inflight("zb-h2", pp, 1, m, j, (3,)) == min(2 * pp - 1, m)


def test_zb_h1_search_beats_the_1f1b_search_on_a_bubble_bound_job() -> None:
    """Llama-3 70B on 128 H100, 64 sequences of 8k, pp 8 (docs/user-guide.md's example): the
    best ZB-H1 plan is faster than the best 1F1B plan of the same pipeline depth (each searched
    over every other axis), and its bubble is under half of 1F1B's on the same plan."""
    from autoparallel_cp import api

    job = api.make_job("llama3-70b", "dgx-h100", gpus=128, seq_len=8192, global_batch=64)
    zb = api.solve(job, top_k=1, fix="schedule=zb-h1,pp=8")
    one = api.solve(job, top_k=1, fix="schedule=1f1b,pp=8")
    assert zb.status == one.status == "optimal"
    best = zb.plans[0]
    assert best.plan.schedule == "zb-h1"
    assert best.time.step_s < one.plans[0].time.step_s
    as_1f1b = evaluate(job, best.plan.model_copy(update={"schedule": None}))
    assert best.time.bubble_s < 0.5 * as_1f1b.time.bubble_s
