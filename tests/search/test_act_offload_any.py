"""A pinned activation offload searched with recompute, interleaving and every searched
schedule (search/act_offload.py, issue 31 "one space"): CP-SAT equals the enumerator on random
small dense and MoE jobs with recompute pinned or free, vpp 1-2 and the schedules, the
master's LB stays below every plan's exact cost, `plan_cost` equals evaluate on the new
plans, tables left unscaled break the LB test, and what stays refused says why."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_act_offload_search import _compare_or_none
from test_offload_search import _cluster, _job
from test_solver_vs_enumerate import _assert_master_bounds, _key, _ranked_or_raise

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.errors import InputError
from autoparallel_cp.search import tables as tables_mod
from autoparallel_cp.search.act_offload import scored
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import Job

SCHEDULES = [None, "interleaved", "gpipe", "zb-h1", "zb-h2", "dualpipe", "zbv", "dualpipev"]


def _pinned(job: Job, fix: dict[str, Any]) -> SearchSpace | None:
    """The pinned space, or None where a pin leaves no plan (exit 2, as for the unpinned
    search: e.g. a V schedule on a dense model, interleaving at pp 1)."""
    try:
        return SearchSpace.for_job(job, fix=fix, max_mbs=2, max_pp=4, zero=(0, 1))
    except InputError:
        return None


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=8, gpus=8, seq=32768, k=2, rc="full", vpp=2, sched=None)
# a vpp = 2 pin with pp = 1 in the space: no one-stage part (they held vpp = 1 plans)
@example(moe=False, layers=4, gpus=4, seq=8192, k=1, rc=None, vpp=2, sched=None)
@example(moe=False, layers=4, gpus=4, seq=8192, k=3, rc=None, vpp=2, sched=None)
@example(moe=False, layers=6, gpus=4, seq=32768, k=3, rc=None, vpp=None, sched=None)
@example(moe=True, layers=8, gpus=8, seq=8192, k=2, rc=None, vpp=None, sched="zb-h1")
@example(moe=True, layers=8, gpus=8, seq=8192, k=1, rc="selective", vpp=None,
         sched="dualpipe")
@example(moe=True, layers=8, gpus=8, seq=8192, k=2, rc=None, vpp=None, sched="dualpipev")
# at most 8 layers on 8 GPUs (k * pp = 8 layers still meets the every-stage->=k edge): MoE,
# 12 layers on 16 GPUs under the default schedules was 295k plans the cost model scores one
# by one, and one such draw took the test from under 20 s to over 2 minutes
@given(moe=st.booleans(), layers=st.sampled_from([4, 6, 8]),
       gpus=st.sampled_from([4, 8]), seq=st.sampled_from([8192, 32768]),
       k=st.integers(1, 3), rc=st.sampled_from([None, "none", "selective", "full"]),
       vpp=st.sampled_from([None, 2]), sched=st.sampled_from(SCHEDULES))
def test_pinned_offload_with_every_axis_matches_enumeration(
        moe: bool, layers: int, gpus: int, seq: int, k: int, rc: str | None, vpp: int | None,
        sched: str | None) -> None:
    """CP-SAT == the enumerator within the proven bound, every returned plan a plan of the
    space evaluate accepts (k layers offloaded, stages >= k layers), the master's LB below
    every plan's exact cost, so is a scored part's per-key bound (act_offload_bound.py), and
    each part's `plan_cost` equal to evaluate's."""
    job = _job(moe, layers, gpus, seq).model_copy(update={"search_also": ()})
    fix: dict[str, Any] = {"activation_offload": k}
    fix.update({n: v for n, v in (("recompute", rc), ("vpp", vpp), ("schedule", sched))
                if v is not None})
    space = _pinned(job, fix)
    if space is None:
        return
    if rc is not None:
        assert space.recompute == (rc,)
    res = _compare_or_none(job, space)
    if res is None:
        return
    for ev in res.plans:
        assert ev.fits and ev.plan.activation_offload == k
        assert min(ev.plan.layers_per_stage(layers)) >= k
        assert outside(space, ev.plan) is None
        again = evaluate(job, ev.plan)
        assert again.fits and again.time.step_s == pytest.approx(ev.time.step_s, rel=1e-12)
    _assert_master_bounds(job, space, 2)
    for sub in space.schedule_variants():
        if not scored(sub):
            continue
        t = build_tables(sub)
        try:
            ranked = _ranked_or_raise(job, sub)
        except Exception:  # noqa: BLE001  a part where nothing fits
            continue
        for cost, plan in ranked:  # the per-key bound (act_offload_bound.py) below each plan
            assert key_bound(t, _key(plan)) <= cost + 1e-9, plan.short()
        for cost, plan in ranked[::5]:
            ev = evaluate(job, plan)
            pc = plan_cost(t, plan)
            assert pc.fits == ev.fits and cost == pc.step_s
            assert pc.step_s == pytest.approx(ev.time.step_s - ev.time.fixed_s, rel=1e-12)


def test_an_interleaved_offload_wins_on_llama3_8b() -> None:
    """Llama-3 8B on 16 H100, seq 8192, batch 256, `--fix activation_offload=2` (the brief's
    command): the best plan offloads and interleaves (vpp > 1), a plan the pin did not search
    before (vpp = 1 only), and evaluate agrees with the solver's cost."""
    from autoparallel_cp.search.solve import solve
    from autoparallel_cp.spec.loaders import load_cluster, load_model

    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100").take_gpus(16),
              seq_len=8192, global_batch=256)
    res = solve(job, fix="activation_offload=2", top_k=1)
    best = res.plans[0]
    assert res.status == "optimal" and best.plan.activation_offload == 2
    assert best.plan.vpp > 1 and best.plan.pp > 1
    assert evaluate(job, best.plan).time.step_s == pytest.approx(best.time.step_s, rel=1e-12)


def test_unscaled_tables_break_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """`lower_acts` is needed: with the scored parts' activation tables left as they are (a
    too-large scaling, s = 1), the master's memory condition drops a key whose exact plan
    fits only by offloading, so the LB test fails; with the scaling it passes."""
    job = _job(False, 6, 4, 32768, wide=True).model_copy(update={"search_also": ()})
    space = SearchSpace.for_job(job, fix={"activation_offload": 3}, max_mbs=2, max_pp=4,
                                zero=(0, 1))
    _assert_master_bounds(job, space, 1)
    monkeypatch.setattr(tables_mod, "lower_acts", lambda space, t: None)
    with pytest.raises(AssertionError):
        _assert_master_bounds(job, space, 1)


def test_refusals_name_why() -> None:
    """Several node groups search what one does (recompute, vpp > 1, other schedules, pp > 1
    over every stage placement: tests/search/test_act_offload_multi.py); the proof line says
    what the pin covers."""
    from test_solver_vs_enumerate import _mixed_small

    host = _cluster(8).node_groups[0].host
    c = _mixed_small()
    c = c.model_copy(update={"node_groups": [g.model_copy(update={"host": g.host or host})
                                             for g in c.node_groups]})
    job = Job(model=_job(False, 8, 8).model, cluster=c, seq_len=4096, global_batch=16)
    sp = SearchSpace.for_job(job, fix={"activation_offload": 2}, max_pp=4)
    assert sp.pp == (1, 2, 4) and "full" in sp.recompute
    assert "every stage placement on the node groups" in proof_space(sp)["offload"]
    for pin in ({"recompute": "full"}, {"schedule": "zb-h1"}):
        got = SearchSpace.for_job(job, fix={"activation_offload": 2, **pin}, max_pp=4)
        assert got.pp == (2, 4) or got.pp == (1, 2, 4)
    one = _job(False, 8, 8).model_copy(update={"search_also": ()})
    text = proof_space(SearchSpace.for_job(one, fix={"activation_offload": 2}))["offload"]
    assert "every recompute mode, vpp and schedule" in text
