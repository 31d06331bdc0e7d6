"""Activation offload as a searched axis (search/act_offload.py, issues 28 and 31.2): with
`--fix activation_offload=k` CP-SAT's top k equals the enumerator's on random small spaces,
the master's bound stays below every plan's exact cost, the tables' cost of every plan equals
`evaluate`'s, the copy time and memory match a hand derivation, bad pins are exit 2."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_offload_search import _cluster, _job
from test_solver_vs_enumerate import _assert_master_bounds, _compare_tol, _ranked_or_raise

from autoparallel_cp.cost import factors as fx
from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.steptime import stage_times
from autoparallel_cp.errors import InfeasibleError, InputError
from autoparallel_cp.search.act_offload import act_layers, kept_share, stage_terms
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


def _compare_or_none(job: Job, space: SearchSpace) -> Any:
    """`_compare_tol`'s top 4, or None when CP-SAT and the enumerator both find no plan."""
    try:
        return _compare_tol(job, space, 4)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            enumerate_plans(job, space, top_k=1)
        return None


def _space(job: Job, k: int, **kw: object) -> SearchSpace:
    return SearchSpace.for_job(job, fix={"activation_offload": k}, max_mbs=2,
                               **kw)  # type: ignore[arg-type]


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=6, gpus=4, seq=32768, k=6, recipe=None, offload=False, zero="0,1")
@example(moe=True, layers=4, gpus=8, seq=8192, k=2, recipe="megatron-bf16", offload=True,
         zero="1,3")
@given(moe=st.booleans(), layers=st.sampled_from([4, 6]), gpus=st.sampled_from([4, 8]),
       seq=st.sampled_from([8192, 32768]), k=st.integers(1, 3),
       recipe=st.sampled_from([None, "megatron-bf16"]), offload=st.booleans(),
       zero=st.sampled_from(["0,1", "1,3"]))
def test_pinned_activation_offload_matches_enumeration(moe: bool, layers: int, gpus: int,
                                                       seq: int, k: int, recipe: str | None,
                                                       offload: bool, zero: str) -> None:
    """The pin with every other axis (the optimizer share searched too, `offload`; pp > 1
    where no Megatron row refuses it and every stage can hold k layers; two ZeRO stages and
    mbs 1 per example, which cut the model-scored pp > 1 part the enumerator scores plan by
    plan to a third: mbs 2 is test_pipelined_activation_offload_matches_enumeration's):
    CP-SAT == enumeration within the proven bound, the master's LB below every plan, and
    every returned plan offloads k layers and fits its GPUs and hosts."""
    job = _job(moe, layers, gpus, seq, recipe=recipe)
    if not offload:
        job = job.model_copy(update={"search_also": ()})
    zs = tuple(int(z) for z in zero.split(","))
    space = SearchSpace.for_job(job, fix={"activation_offload": k}, max_mbs=1, zero=zs)
    # every recompute mode the unpinned search takes (issue 31, "one space")
    assert space.recompute == SearchSpace.for_job(job, max_mbs=1, zero=zs).recompute
    assert 1 in space.pp and all(p * k <= layers for p in space.pp)
    res = _compare_or_none(job, space)
    if res is None:
        return
    for ev in res.plans:
        assert ev.fits and ev.plan.activation_offload == k
        assert min(ev.plan.layers_per_stage(layers)) >= k
    _assert_master_bounds(job, space, 3)


def test_tables_cost_equals_evaluate_on_every_plan() -> None:
    """`plan_cost` (scaled activation tables, the copy time, the host check) gives evaluate's
    step time and fit on every plan of a pinned space, copies exposed on some."""
    job = _job(False, 6, 4, 32768, wide=True)
    job = job.model_copy(update={"cluster": _slow_link(job)})
    space = _space(job, 4, zero=(0, 1))
    exposed = 0
    for sub in space.schedule_variants():  # each part's own tables (act_offload.py)
        t = build_tables(sub)
        ranked = _ranked_or_raise(job, sub)
        assert ranked
        for cost, plan in ranked:
            ev = evaluate(job, plan)
            pc = plan_cost(t, plan)
            assert pc.fits == ev.fits
            assert pc.step_s == pytest.approx(ev.time.step_s, rel=1e-12)
            assert cost == pc.step_s
            exposed += ev.time.offload_s > 0.0
    assert exposed


def _slow_link(job: Job, gbps: float = 2.0) -> object:
    """The job's cluster with a slow host link (the copies stick out of the compute)."""
    groups = []
    for g in job.cluster.node_groups:
        assert g.host is not None
        groups.append(g.model_copy(update={"host": g.host.model_copy(
            update={"link_gbps": gbps})}))
    return job.cluster.model_copy(update={"node_groups": groups})


def test_copy_time_and_memory_by_hand() -> None:
    """One stage of L = 4 layers, k = 2 offloaded, a 2 GB/s host link: per micro-batch the
    copies move d = k·a / link each way (a = one layer's activation bytes), F and B are the
    stage's forward and the rest of its compute, so the exposed time is (d - F) + (d - B) =
    2d - S where d exceeds both; the GPU keeps (L - k + 1)·a of layer activations instead of
    L·a, the host k·a per GPU."""
    job = _job(False, 4, 4, 8192, wide=True)
    job = job.model_copy(update={"cluster": _slow_link(job)})
    base = Plan(dp=4, tp=1, pp=1, zero=1, mbs=1, num_microbatches=4)
    off = base.model_copy(update={"activation_offload": 2})
    lf = fx.layer_factors(job, 0, 1, 1, 1, 0, 1, 0, moe=False)
    a = float(lf.act_bytes)
    st0 = stage_times(job, base)[0]
    st1 = stage_times(job, off)[0]
    S = st0.compute_s + st0.tp_s + st0.cp_s + st0.ep_s
    d = 2 * a / 2e9
    assert d > S  # the copy of two layers outlasts the whole stage's compute
    assert st1.offload_s == pytest.approx(2 * d - S, rel=1e-12)
    e0, e1 = evaluate(job, base), evaluate(job, off)
    assert e1.time.offload_s == pytest.approx(4 * (2 * d - S), rel=1e-12)  # m = 4 per step
    assert e0.memory.activations_bytes - e1.memory.activations_bytes == pytest.approx(a, rel=1e-9)
    assert e1.memory.host_bytes == pytest.approx(2 * a, rel=1e-12)
    # the search: kept share (4 - 2 + 1) / 4 of every layer's entry, the same copy time
    sp = _space(job, 2, zero=(1,)).schedule_variants()[0]  # the exact one-stage part
    assert sp.pp == (1,) and sp.recompute == ("none",) and kept_share(sp) == 0.75
    assert stage_terms(sp, 1, 1, 4, 1, 0, 1, 1, 4) == (st1.offload_s, True)
    assert plan_cost(build_tables(sp), off).step_s == pytest.approx(e1.time.step_s, rel=1e-12)


def test_hosts_too_small_leave_no_plan() -> None:
    """A host that cannot hold k offloaded layers: no plan without recompute fits (evaluate
    agrees; with every layer recomputed nothing is kept, so nothing goes to the host)."""
    job = _job(False, 4, 4, 32768, wide=True, host_gib=1.0)
    space = SearchSpace.for_job(job, fix={"activation_offload": 2, "recompute": "none"},
                                max_mbs=2, zero=(1,))
    with pytest.raises(InfeasibleError):
        solve(job, space, top_k=1, time_limit=30, workers=1)
    with pytest.raises(InfeasibleError):
        enumerate_plans(job, space, top_k=1)
    ev = evaluate(job, Plan(dp=4, pp=1, zero=1, mbs=1, num_microbatches=4,
                            activation_offload=2))
    assert not ev.fits


@pytest.mark.parametrize("fix, kw, match", [
    ("activation_offload=9", {}, "layer count in 0..4"),
    ("activation_offload=2,pp=4", {}, "every stage"),
    ("activation_offload=2,recompute=full", {"emit": "megatron"}, "without recompute"),
    ("activation_offload=2,pp=2", {"emit": "megatron"}, "pipeline parallelism"),
    ("activation_offload=4", {"emit": "megatron"}, "k < num_layers"),
    ("activation_offload=1", {"recipe": "torchtitan-fsdp"}, "torchtitan"),
    ("activation_offload=1", {"hosts": False}, "host"),
])
def test_bad_pins_are_input_errors(fix: str, kw: dict[str, object], match: str) -> None:
    emit = kw.pop("emit", None)
    job = _job(False, 4, 8, **kw)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=match):
        SearchSpace.for_job(job, fix=fix, max_pp=4, emit=emit)  # type: ignore[arg-type]


def test_zero_pin_is_the_default_space() -> None:
    job = _job(False, 4, 8)
    assert SearchSpace.for_job(job, fix="activation_offload=0").pp == \
        SearchSpace.for_job(job).pp
    assert _cluster(8).node_groups[0].host is not None


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=6, gpus=4, seq=32768)
@given(moe=st.booleans(), layers=st.sampled_from([4, 6]), gpus=st.sampled_from([4, 8]),
       seq=st.sampled_from([8192, 32768]))
def test_searched_activation_offload_matches_enumeration(moe: bool, layers: int, gpus: int,
                                                         seq: int) -> None:
    """`--search-also offload`: the one-stage sub-spaces of `domain` join the union; CP-SAT
    == enumeration, and every returned plan lies in the space (`outside` is None)."""
    job = _job(moe, layers, gpus, seq)
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=1, max_mbs=2, zero=(1,))
    top = layers - 1
    assert space.act_axis == tuple(sorted({-(-top // 2), top}))
    subs = space.schedule_variants()
    assert [act_layers(v) for v in subs] == [0, *space.act_axis]
    assert space.size() == sum(v.size() for v in subs)
    res = _compare_tol(job, space, 6)
    for ev in res.plans:
        assert ev.fits and outside(space, ev.plan) is None
    assert "activations of 0, " in proof_space(space)["offload"]


def test_domain_follows_the_frameworks_and_the_request() -> None:
    """The default search has no activation-offload axis; `--search-also offload` adds
    ceil((L-1)/2) and L - 1 where Megatron (or no framework) runs it, none under torchtitan
    or without hosts; a plan outside is named with the hint."""
    job = _job(False, 6, 8)
    plain = job.model_copy(update={"search_also": ()})
    assert SearchSpace.for_job(plain).act_axis == ()
    assert len(SearchSpace.for_job(plain).schedule_variants()) == 1
    assert SearchSpace.for_job(job).act_axis == (3, 5)
    assert SearchSpace.for_job(job, emit="megatron").act_axis == (3, 5)
    assert SearchSpace.for_job(_job(False, 6, 8, recipe="torchtitan-fsdp")).act_axis == ()
    assert SearchSpace.for_job(_job(False, 6, 8, hosts=False)).act_axis == ()
    assert SearchSpace.for_job(job, fix="pp=2").act_axis == ()
    p = Plan(dp=8, pp=1, zero=1, mbs=1, num_microbatches=2, activation_offload=4)
    assert "searched: 0, 3, 5" in str(outside(SearchSpace.for_job(job), p))
    assert "--search-also offload" in str(outside(SearchSpace.for_job(plain), p))
    assert outside(SearchSpace.for_job(job), p.model_copy(
        update={"activation_offload": 3})) is None


def test_activation_offload_wins_where_activations_bind() -> None:
    """Llama 2 13B on 8 A100 40 GB, one stage (pp=1, cp=1, mbs=1 pinned), `--search-also
    offload`: the activations of all 40 layers do not fit beside the states without recompute,
    and offloading 20 of them (the copies hidden behind the compute over PCIe Gen4) beats both
    recompute and the optimizer share on the host; the enumerator agrees."""
    from autoparallel_cp.spec.loaders import load_model

    job = Job(model=load_model("llama2-13b"), cluster=_cluster(8), seq_len=4096,
              global_batch=64, search_also=("offload",))
    space = SearchSpace.for_job(job, fix="pp=1,cp=1,mbs=1", partial_recompute=False)
    assert space.act_axis == (20, 39)
    a = solve(job, space, top_k=3, time_limit=60, workers=1)
    best = a.plans[0]
    assert best.plan.activation_offload == 20 and best.fits and best.time.offload_s == 0.0
    kept = evaluate(job, best.plan.model_copy(update={"activation_offload": 0}))
    assert not kept.fits  # the same plan with its activations on the GPU does not fit
    # it removes 19 of the 40 layers' activations (one offloaded layer stays in transit)
    p = best.plan
    one = float(fx.layer_factors(job, 0, p.tp, p.cp, p.ep, p.sp, p.mbs, 0, moe=False).act_bytes)
    removed = kept.memory.activations_bytes - best.memory.activations_bytes
    assert removed == pytest.approx(19 * one, rel=1e-9)
    e = enumerate_plans(job, space, top_k=3)
    assert [(q.key()[:11], q.activation_offload, q.optimizer_offload)
            for _, q in e.stats["ranked"]] == [
        (ev.plan.key()[:11], ev.plan.activation_offload, ev.plan.optimizer_offload)
        for ev in a.plans]


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=8, gpus=8, seq=32768, k=2, pp=2, partial=False)
@example(moe=True, layers=8, gpus=8, seq=8192, k=2, pp=4, partial=True)
@example(moe=False, layers=8, gpus=4, seq=32768, k=3, pp=1, partial=True)
@given(moe=st.booleans(), layers=st.sampled_from([6, 8]), gpus=st.sampled_from([4, 8]),
       seq=st.sampled_from([8192, 32768]), k=st.integers(2, 3), pp=st.sampled_from([1, 2, 4]),
       partial=st.booleans())
def test_pipelined_activation_offload_matches_enumeration(moe: bool, layers: int, gpus: int,
                                                          seq: int, k: int, pp: int,
                                                          partial: bool) -> None:
    """`--fix activation_offload=k,pp=P` at P in {1, 2, 4} (issue 31.2): CP-SAT == the
    enumerator, the master's LB below every plan's exact cost, every plan's tables cost
    (`plan_cost`, the cost model for pp > 1) equal to evaluate's, and every returned plan a
    plan of the space that evaluate accepts, its stages holding >= k layers. Partial
    recompute is drawn (`partial`): with it, MoE, 8 layers at pp 2 is 13.6k plans the
    enumerator scores one by one (24 s), 5.7k without."""
    job = _job(moe, layers, gpus, seq).model_copy(update={"search_also": ()})
    try:
        space = SearchSpace.for_job(job, fix={"activation_offload": k, "pp": pp}, max_mbs=2,
                                    zero=(0, 1), partial_recompute=partial)
    except InputError:
        assert pp * k > layers  # the only refusal here: a stage would hold < k layers
        return
    res = _compare_or_none(job, space)
    if res is None:
        return
    for ev in res.plans:
        assert ev.fits and ev.plan.activation_offload == k and ev.plan.pp == pp
        assert min(ev.plan.layers_per_stage(layers)) >= k
        assert outside(space, ev.plan) is None
        again = evaluate(job, ev.plan)
        assert again.fits and again.time.step_s == pytest.approx(ev.time.step_s, rel=1e-12)
    _assert_master_bounds(job, space, 2)
    for sub in space.schedule_variants():
        t = build_tables(sub)
        for cost, plan in _ranked_or_raise(job, sub)[::3]:
            ev = evaluate(job, plan)
            pc = plan_cost(t, plan)
            assert pc.fits == ev.fits and cost == pc.step_s
            assert pc.step_s == pytest.approx(ev.time.step_s - ev.time.fixed_s, rel=1e-12)


def test_pinned_offload_holds_every_part() -> None:
    """The pin alone: the exact one-stage part (tables, partition model: pp = 1, recompute
    none) and the parts the cost model scores (search/act_offload.py `scored`: pp = 1 with
    selective / full recompute, pp > 1 with every mode), disjoint, their sizes summing; the
    scored parts' layer activations are scaled by 1 - (k - 1)·P/L (one layer kind, P their
    largest pp); under Megatron's row (no CPU offloading with pp > 1 or recompute) only the
    exact one-stage part stays."""
    from autoparallel_cp.search.act_offload import scored
    from autoparallel_cp.search.model_scored import model_scored

    job = _job(False, 8, 8).model_copy(update={"search_also": ()})
    space = SearchSpace.for_job(job, fix={"activation_offload": 2}, max_pp=4)
    one, rc, many = space.schedule_variants()
    assert (one.pp, rc.pp, many.pp) == ((1,), (1,), (2, 4))
    assert (one.recompute, rc.recompute) == (("none",), ("selective", "full"))
    assert many.recompute == ("none", "selective", "full") and many.vpp == space.vpp
    assert not scored(one) and scored(rc) and scored(many)
    assert model_scored(many) and model_scored(rc) and not model_scored(one)
    assert space.size() == one.size() + rc.size() + many.size()
    # one-stage tables: (L - k + 1)/L = 7/8 of the layer's entry; pp > 1: 1 - 1·4/8 = 1/2,
    # pp = 1 with recompute: 1 - 1·1/8 = 7/8 (modes none and selective: one kind, a_max = a_min)
    t1, tm = build_tables(one), build_tables(many)
    np.testing.assert_allclose(tm.act[0, False][..., :2],
                               t1.act[0, False][..., :2] * (0.5 / (7 / 8)), rtol=1e-12)
    # full recompute: a kept layer's bytes over the least of kept and checkpoint (module
    # docstring), the checkpoint entry scaled alike
    a = t1.act[0, False][..., 2] / (7 / 8)
    c = t1.ckpt[0, False]
    s2 = np.clip(1.0 - 4 * a / (8 * np.minimum(a, c)), 0.0, 1.0)
    np.testing.assert_allclose(tm.act[0, False][..., 2], a * s2, rtol=1e-12)
    np.testing.assert_allclose(tm.ckpt[0, False], c * s2, rtol=1e-12)
    mg = SearchSpace.for_job(job, fix={"activation_offload": 2}, max_pp=4, emit="megatron")
    assert mg.pp == (1,) and mg.recompute == ("none",) and len(mg.schedule_variants()) == 1


def test_outside_names_the_pipelined_part() -> None:
    """A pp > 1 plan offloading k layers lies in the pinned space when its split is searched:
    uniform, and a free uneven split with every stage >= k (act_offload_free.py); a stage of
    fewer than k layers is outside it, the rule named."""
    job = _job(False, 8, 8).model_copy(update={"search_also": ()})
    space = SearchSpace.for_job(job, fix={"activation_offload": 2}, max_pp=4)
    p = Plan(dp=4, pp=2, zero=1, mbs=1, num_microbatches=4, activation_offload=2)
    assert outside(space, p) is None
    assert outside(space, p.model_copy(update={"stage_layers": (3, 5)})) is None
    why = outside(space, p.model_copy(update={"stage_layers": (1, 7)}))
    assert why is not None and "activation_offload=2: every stage >= 2" in why
    assert "pp > 1" in proof_space(space)["offload"]
    plain = SearchSpace.for_job(job)  # the default search names the pin that covers it
    assert "--fix activation_offload=2 searches it" in str(outside(plain, p))


def test_several_node_groups_search_pp_above_one() -> None:
    """On a cluster of several node groups the pin searches the pp > 1 parts too (issue 31,
    tests/search/test_act_offload_multi.py): pp 2 and 4 kept, a pinned pp = 2 searched, a pp whose
    placements exceed `PLACEMENTS_MAX` is exit 2 naming the cap."""
    from test_solver_vs_enumerate import _mixed_small

    host = _cluster(8).node_groups[0].host  # DGX A100's host on every group
    c = _mixed_small()
    c = c.model_copy(update={"node_groups": [g.model_copy(update={"host": g.host or host})
                                             for g in c.node_groups]})
    job = Job(model=_job(False, 8, 8).model, cluster=c, seq_len=4096, global_batch=16)
    assert len(c.node_groups) > 1
    assert SearchSpace.for_job(job, fix={"activation_offload": 2}, max_pp=4).pp == (1, 2, 4)
    assert SearchSpace.for_job(job, fix={"activation_offload": 2, "pp": 2}).pp == (2,)
    big = Job(model=_job(False, 32, 8).model, cluster=c, seq_len=4096, global_batch=16)
    with pytest.raises(InputError, match="stage placements"):
        SearchSpace.for_job(big, fix={"activation_offload": 2, "pp": 16})


def test_named_layouts_keep_k_layers_per_stage() -> None:
    """The pp > 1 part lists only the named layouts whose every stage holds >= k layers
    (evaluate refuses the others: spec/schedules.py `offload_violations`), and its free
    splits only those whose every stage holds >= k (act_offload.py `stage_min`), so its size
    counts the plans it scores."""
    from autoparallel_cp.search.enumerate_axes import partition_array
    from autoparallel_cp.spec.splits import named_layouts

    job = _job(False, 8, 8).model_copy(update={"search_also": ()})
    def least(cl: tuple[int, ...]) -> int:
        return min(sum(cl[j::4]) for j in range(4))

    fix = {"activation_offload": 2, "pp": 4, "vpp": 2}
    (many,) = SearchSpace.for_job(job, fix=fix).schedule_variants()
    k_less = [cl for cl in named_layouts(8, 4, 2) if least(cl) < 2]
    assert k_less  # Megatron's edge-accounting layouts leave a stage of one layer here
    assert all(least(cl) >= 2 for cl in many.layouts(4, 2))
    (one,) = SearchSpace.for_job(job, fix={**fix, "activation_offload": 1}).schedule_variants()
    assert set(k_less) <= set(one.layouts(4, 2))  # k = 1: all
    for k in (1, 2, 3):
        for pp, vpp in ((2, 1), (2, 2), (4, 1)):
            if pp * k > 8:
                continue
            sp = SearchSpace.for_job(job, fix={"activation_offload": k, "pp": pp, "vpp": vpp})
            (v,) = sp.schedule_variants()
            rows, _ = partition_array(v, pp, vpp)
            assert v.free_ok(pp, vpp)
            assert v.num_partitions(pp, vpp) == sum(1 for r in rows if min(r) >= k) > 0
