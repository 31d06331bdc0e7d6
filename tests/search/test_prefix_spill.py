"""A dense prefix over several stages (task prefixspill, issues 31 / 28 "one space"): an MoE
model's `first_k_dense_layers` = K lies layer by layer in stage order (cost/memory.py
`stage_layer_kinds`, spec/splits.py `prefix_counts`), so a split whose first stage holds fewer
than K layers puts the rest of the prefix on the next stage(s). Pinned splits and named layouts
with the prefix spilling are searched and costed as `evaluate` costs them (cpsat_prefix.py
`holders(pinned=...)`, key_grid.py `k_fixed`, dualpipe_bound.py `split_bounds`); CP-SAT
equals the enumerator, every bound stays below the enumerator's exact best."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cpsat_partition import _check_every_key, _check_key_bound_of
from test_solver_vs_enumerate import _assert_master_bounds, _compare_tol, _mini, _mixed_small

from autoparallel_cp import api
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.model import ModelSpec
from autoparallel_cp.spec.splits import named_layouts, prefix_counts

DSV3_SPLIT = (2,) + (4,) * 14 + (3,)


def _moe(layers: int, k: int) -> ModelSpec:
    m = _mini(True, layers)
    assert m.moe is not None
    return m.model_copy(update={"moe": m.moe.model_copy(update={"first_k_dense_layers": k})})


def _job(layers: int, k: int, gpus: int = 8, batch: int = 16, seq: int = 4096) -> Job:
    return Job(model=_moe(layers, k), cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
               seq_len=seq, global_batch=batch)


def test_the_pinned_deepseek_v3_split_solves_to_evaluates_step() -> None:
    """The issue's case: DeepSeek-V3's DualPipe layout 2:4x14:3 pinned (2 of the 3 dense
    layers on stage 0, the third on stage 1) had "no feasible plan"; it solves now, its step
    evaluate's, the plan the pinned split."""
    job = api.make_job("deepseek-v3", "dgx-h800", gpus=2048, seq_len=4096, global_batch=15360,
                       recipe="deepseek-v3-fp8")
    split = ":".join(map(str, DSV3_SPLIT))
    res = api.solve(job, top_k=2, fix=f"schedule=dualpipe,tp=1,pp=16,ep=64,mbs=1,"
                                      f"stage_layers={split}")
    assert res.status == "optimal"
    best = res.plans[0]
    assert best.plan.stage_layers == DSV3_SPLIT
    ev = evaluate(job, best.plan)
    assert best.time.step_s == pytest.approx(ev.time.step_s, rel=1e-9)
    assert plan_cost(build_tables(SearchSpace.for_job(job, fix=f"schedule=dualpipe,tp=1,"
                                  f"pp=16,ep=64,mbs=1,stage_layers={split}")),
                     best.plan).step_s == pytest.approx(ev.time.step_s, rel=1e-12)


def test_the_pinned_split_is_in_the_space() -> None:
    """`num_degree_combinations` counts the pinned spilled split's degrees (it was 0: the
    infeasibility message named the prefix instead)."""
    job = api.make_job("deepseek-v3", "dgx-h800", gpus=2048, seq_len=4096, global_batch=15360)
    split = ":".join(map(str, DSV3_SPLIT))
    sp = SearchSpace.for_job(job, fix=f"tp=1,pp=16,ep=64,cp=1,stage_layers={split}")
    assert sp.num_degree_combinations() > 0 and sp.placeable(16, 1)


SPILLED = [  # (layers, K, pp, vpp, chunk_layers): the first stage short of the prefix
    (6, 2, 2, 1, (1, 5)),
    (6, 3, 2, 1, (2, 4)),
    (8, 3, 4, 1, (2, 1, 3, 2)),
    (8, 3, 4, 1, (1, 1, 3, 3)),
    (8, 3, 2, 2, (1, 3, 1, 3)),
    (6, 2, 2, 2, (1, 2, 0, 3)),
]


@pytest.mark.parametrize("case", SPILLED)
def test_plan_cost_is_evaluates_on_spilled_splits(case: tuple[int, ...]) -> None:
    """tables.plan_cost == evaluate on plans whose prefix spans several stages."""
    L, k, pp, vpp, *_ = case
    cl = tuple(case[4])  # type: ignore[arg-type]
    job = _job(L, k)
    sp = SearchSpace.for_job(job, fix=f"pp={pp},vpp={vpp},chunk_layers="
                             + ":".join(map(str, cl)), max_pp=4, max_vpp=2, max_mbs=2)
    per = tuple(sum(cl[j::pp]) for j in range(pp))
    assert prefix_counts(k, per)[0] < k  # the prefix spills
    plans = enumerate_plans(job, sp, top_k=3).plans
    assert plans
    t = build_tables(sp)
    for ev in plans:
        assert ev.plan.layers_per_stage(L) == per
        ex = evaluate(job, ev.plan)
        assert ev.time.step_s == pytest.approx(ex.time.step_s, rel=1e-12)
        assert plan_cost(t, ev.plan).step_s == pytest.approx(ex.time.step_s, rel=1e-12)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(SPILLED), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16]), zero=st.sampled_from([(0, 1), (1, 3)]),
       sched=st.sampled_from([None, "zb-h1", "gpipe", "dualpipe"]), partial=st.booleans())
def test_pinned_spilled_splits_cpsat_and_bounds(case: tuple[int, ...], gpus: int, batch: int,
                                                zero: tuple[int, ...], sched: str | None,
                                                partial: bool) -> None:
    """A pinned split short of the prefix: CP-SAT's top k == the enumerator's, every key's
    per-key model == its exact best, every per-key and master bound <= it (partial recompute:
    key_grid.py's closed form gives way to the grid where a later stage holds dense layers)."""
    L, k, pp, vpp, *_ = case
    cl = tuple(case[4])  # type: ignore[arg-type]
    if sched is not None and vpp > 1:
        return  # (interleaved: 1F1B's only)
    job = _job(L, k, gpus, batch)
    fix = f"pp={pp},vpp={vpp},chunk_layers=" + ":".join(map(str, cl)) + (
        f",schedule={sched}" if sched else "")
    try:
        sp = SearchSpace.for_job(job, fix=fix, max_pp=4, max_vpp=2, max_mbs=2, zero=zero,
                                 partial_recompute=partial)
    except UserError:
        return
    _check_spilled(job, sp)


@pytest.mark.parametrize("case", [c for c in SPILLED if c[2] == 2])
def test_pinned_spilled_splits_on_two_node_groups(case: tuple[int, ...]) -> None:
    """Two node groups (cpsat_prefix.py `on_groups`: each stage's constant share on its
    group): CP-SAT == the enumerator, the bounds below it, under 1F1B and DualPipe (vpp 2:
    interleaved)."""
    L, k, pp, vpp, *_ = case
    cl = tuple(case[4])  # type: ignore[arg-type]
    job = Job(model=_moe(L, k), cluster=_mixed_small(), seq_len=4096, global_batch=32)
    for sched in ("1f1b", "dualpipe") if vpp == 1 else ("interleaved",):
        fix = f"tp=8,pp={pp},vpp={vpp},schedule={sched},chunk_layers=" + ":".join(map(str, cl))
        sp = SearchSpace.for_job(job, fix=fix, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3))
        assert _check_spilled(job, sp)


def _check_spilled(job: Job, sp: SearchSpace) -> bool:
    """CP-SAT == the enumerator, each key's model == its best, the bounds below it; False
    when the space is empty or nothing fits."""
    if sp.num_degree_combinations() == 0:
        return False
    try:
        enumerate_plans(job, sp, top_k=1)
    except InfeasibleError:
        return False
    _compare_tol(job, sp, 3)
    _check_every_key(sp, stride=2)
    _check_key_bound_of(sp)
    _assert_master_bounds(job, sp, 2)
    return True


def test_deepseek_v3s_published_layout_is_a_named_layout() -> None:
    """2:4x14:3 (one embedding and one loss slot, the remainder on the latest chunks: spec/
    splits.py `REMAINDER_LATEST`, searched with a dense prefix) is among the named layouts of
    DeepSeek-V3 on pp 16, with the other layouts short of its 3-layer prefix; a dense model
    keeps the earliest-remainder layouts only."""
    job = api.make_job("deepseek-v3", "dgx-h800", gpus=2048, seq_len=4096, global_batch=15360)
    sp = SearchSpace.for_job(job, fix="schedule=dualpipe,tp=1,pp=16,ep=64")
    lays = sp.layouts(16, 1)
    assert DSV3_SPLIT in lays
    assert sum(lay[0] < 3 for lay in lays) == 2  # 2:3:4.. and 2:4..:3
    assert len(named_layouts(61, 16, 1, latest=True)) == 8 and len(named_layouts(61, 16, 1)) == 4
    dense = SearchSpace.for_job(_job(9, 0), fix="pp=2,vpp=2", max_mbs=2)
    assert dense.layouts(2, 2) == named_layouts(9, 2, 2) != named_layouts(9, 2, 2, latest=True)


@pytest.mark.parametrize("sched", ["interleaved", "zbv"])
def test_named_layouts_short_of_the_prefix_are_searched(sched: str) -> None:
    """9 layers with a 5-layer prefix on pp 2 x vpp 2: the named layouts include splits whose
    first stage holds 4 layers; CP-SAT's top k (free splits and every named layout) == the
    enumerator's, the bounds below each key's best. (At vpp 1 a named layout is a free split:
    `SearchSpace._named` leaves it to the free family.)"""
    job = _job(9, 5)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched},pp=2,vpp=2", max_pp=4, max_vpp=2,
                             max_mbs=2, zero=(1,))
    assert [cl for cl in sp.layouts(2, 2) if sum(cl[0::2]) < 5]
    assert _check_spilled(job, sp)
