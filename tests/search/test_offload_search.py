"""Host optimizer offload as a search axis (search/offload_axis.py, issue 31.2): CP-SAT's top k
equals the enumerator's on random small instances with the share searched, the master's bound
stays below every plan's exact cost, the tables' cost of an offloading plan equals
`evaluate`'s, the domain follows the hosts and the frameworks, pins and bad pins."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import (
    _assert_master_bounds,
    _compare_tol,
    _key,  # noqa: I001
    _mini,
    _ranked_or_raise,
)

from autoparallel_cp.cost.evaluate import evaluate
from autoparallel_cp.cost.offload import optimizer_offload_s_per_param
from autoparallel_cp.errors import InputError, UserError
from autoparallel_cp.search.key_bounds import key_bound
from autoparallel_cp.search.offload_axis import OFFLOAD_SHARES, model_host_bytes
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import outside, proof_space
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import RECIPES, Job, ModelSpec
from autoparallel_cp.spec.cluster import ClusterSpec
from autoparallel_cp.spec.loaders import load_cluster, load_model


def _cluster(gpus: int, host_gib: float | None = None, hosts: bool = True) -> ClusterSpec:
    """DGX A100 40 GB nodes (PCIe Gen4 host link); `host_gib` shrinks the host memory,
    `hosts=False` drops the host spec."""
    c = load_cluster("dgx-a100-40g").take_gpus(gpus)
    groups = []
    for g in c.node_groups:
        h = g.host
        if not hosts:
            h = None
        elif host_gib is not None and h is not None:
            h = h.model_copy(update={"memory_gib": host_gib})
        groups.append(g.model_copy(update={"host": h}))
    return c.model_copy(update={"node_groups": groups})


def _wide(layers: int) -> ModelSpec:
    """A 7B-wide model with few layers: its optimizer states bind on 40 GB GPUs."""
    return ModelSpec(name="wide", num_layers=layers, hidden_size=4096, ffn_hidden_size=11008,
                     num_attention_heads=32, num_kv_heads=8, vocab_size=32000)


def _job(moe: bool, layers: int, gpus: int, seq: int = 4096, batch: int = 16,
         recipe: str | None = None, wide: bool = False, **cluster: object) -> Job:
    kw = {} if recipe is None else {"recipe": RECIPES[recipe]}
    model = _wide(layers) if wide else _mini(moe, layers)
    return Job(model=model, cluster=_cluster(gpus, **cluster),  # type: ignore[arg-type]
               seq_len=seq, global_batch=batch, search_also=("offload",), **kw)


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@example(moe=False, layers=6, gpus=4, seq=32768, zero="0,1", recipe=None)  # memory-tight
@given(moe=st.booleans(), layers=st.sampled_from([4, 6]), gpus=st.sampled_from([4, 8]),
       seq=st.sampled_from([8192, 32768]), zero=st.sampled_from(["0,1", "1,3"]),
       recipe=st.sampled_from([None, "megatron-bf16", "deepspeed"]))
def test_offload_axis_matches_enumeration(moe: bool, layers: int, gpus: int, seq: int,
                                          zero: str, recipe: str | None) -> None:
    """The share searched with every other axis: CP-SAT == enumeration (within the proven
    bound); every plan returned fits its GPUs and its hosts."""
    job = _job(moe, layers, gpus, seq, recipe=recipe)
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=2, max_mbs=2,
                                zero=tuple(int(z) for z in zero.split(",")))
    assert len(space.off_axis) > 1
    if space.num_degree_combinations() == 0:
        return
    res = _compare_tol(job, space, 4)
    for ev in res.plans:
        assert ev.fits and ev.plan.optimizer_offload in space.off_axis
        assert outside(space, ev.plan) is None


def test_offload_wins_where_memory_binds_and_is_determined() -> None:
    """Llama 2 13B on 8 A100 40 GB: the optimizer states do not fit beside the activations
    without recompute, so the best plan offloads a share; the enumerator agrees, and two
    solves give the same plans."""
    job = Job(model=load_model("llama2-13b"), cluster=_cluster(8), seq_len=4096,
              global_batch=64, search_also=("offload",))
    # activations pinned on the GPU (activation offload wins here otherwise:
    # tests/search/test_act_offload_search.py)
    space = SearchSpace.for_job(job, fix="pp=1,cp=1,mbs=1,activation_offload=0",
                                partial_recompute=False)
    a = solve(job, space, top_k=3, time_limit=60, workers=1)
    b = solve(job, space, top_k=3, time_limit=60, workers=1)
    assert [p.plan.key() for p in a.plans] == [p.plan.key() for p in b.plans]
    best = a.plans[0]
    x = best.plan.optimizer_offload
    assert x > 0 and best.fits
    on_gpu = evaluate(job, best.plan.model_copy(update={"optimizer_offload": 0.0}))
    # it removes that share of the optimizer states from the GPU and costs host time
    assert best.memory.optimizer_bytes == pytest.approx((1 - x) * on_gpu.memory.optimizer_bytes)
    assert best.time.step_s > on_gpu.time.step_s and not on_gpu.fits
    e = enumerate_plans(job, space, top_k=3)
    assert [(p.key()[:11], p.optimizer_offload) for _, p in e.stats["ranked"]] == [
        (ev.plan.key()[:11], ev.plan.optimizer_offload) for ev in a.plans]


@pytest.mark.parametrize("gpu_master", [False, True])
def test_tables_cost_equals_evaluate_with_offload(gpu_master: bool) -> None:
    """Every 5th plan the enumerator ranks, MoE (expert states sharded apart), at every share
    (the same plan with its share replaced: a key's best is one share); and with Megatron-Core
    without the precision-aware optimizer (behaviour `offload_gpu_master`: the GPU keeps the
    fp32 main copy, the H2D moves it; copies in turn), memory and time alike."""
    from autoparallel_cp.cost.memory import stage_memory

    job = _job(True, 4, 8, seq=8192, batch=8)
    if gpu_master:
        r = job.recipe
        beh = r.behaviour.model_copy(update={"offload_gpu_master": True,
                                             "offload_copies_overlap": False})
        job = job.model_copy(update={"recipe": r.model_copy(update={"behaviour": beh})})
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=1, max_mbs=1, zero=(1, 3))
    ranked = _ranked_or_raise(job, space)
    t = build_tables(space)
    for _, plan in ranked[::5]:
        for x in OFFLOAD_SHARES:
            p = plan.model_copy(update={"optimizer_offload": x})
            ev = evaluate(job, p)
            pc = plan_cost(t, p)
            assert pc.step_s == pytest.approx(ev.time.step_s, rel=1e-9)
            # charged memory: the states' part moves with the share as memory.py's does
            base = plan_cost(t, plan.model_copy(update={"optimizer_offload": 0.0}))
            sm, sm0 = stage_memory(job, p), stage_memory(job, plan.model_copy(
                update={"optimizer_offload": 0.0}))
            for j in range(p.pp):
                drop = sm0[j].optimizer_bytes - sm[j].optimizer_bytes
                assert base.stage_charged[j] - pc.stage_charged[j] == pytest.approx(
                    drop, rel=1e-9, abs=1.0)


def test_master_and_key_bounds_hold_with_offload() -> None:
    """LB(key) and the per-key bound stay below every key's exact best whatever its share
    (the master's tables are the least over the shares; a key's bound the least over its
    legal shares), on a space where offload is the best of several keys."""
    job = _job(False, 12, 4, wide=True, batch=8)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=1, zero=(0, 1, 3))
    _assert_master_bounds(job, space, 2)
    ranked = _ranked_or_raise(job, space)
    assert sum(1 for _, p in ranked if p.optimizer_offload) >= 3
    t = build_tables(space)
    for cost, plan in ranked:
        if plan.optimizer_offload or ranked.index((cost, plan)) % 4 == 0:
            assert key_bound(t, _key(plan)) <= cost * (1 + 1e-9)


def test_offload_only_adds_time_and_removes_gpu_memory() -> None:
    """On the PCIe host link the host side is slower per parameter than the GPU's step, so a
    share only adds step time; it only removes GPU memory (the premise of the offload
    variants' key bounds pruning them at scale)."""
    from autoparallel_cp.cost import factors as fx

    job = _job(False, 4, 8)
    assert optimizer_offload_s_per_param(job, 0) > fx.optimizer_factor(job, 0)
    fix = "pp=1,tp=2,zero=1,mbs=1,recompute=none,sp=1,optimizer_offload="
    by_x = {}
    for x in OFFLOAD_SHARES:
        space = SearchSpace.for_job(job, fix=fix + f"{x:g}")
        c, p = enumerate_plans(job, space, top_k=1).stats["ranked"][0]
        assert p.optimizer_offload == x
        by_x[x] = (c, evaluate(job, p))
    for lo, hi in zip(OFFLOAD_SHARES, OFFLOAD_SHARES[1:], strict=False):
        assert by_x[lo][0] < by_x[hi][0]
        assert by_x[lo][1].memory.peak_bytes > by_x[hi][1].memory.peak_bytes


def test_domain_follows_hosts_and_frameworks() -> None:
    """No host spec: share 0 only (and the proof says why); torchtitan runs none; DeepSpeed
    runs a partial share at ZeRO-3 only, Megatron at zero >= 1 only."""
    no_host = SearchSpace.for_job(_job(False, 4, 8, hosts=False))
    assert no_host.off_axis == (0.0,) and not no_host.multi
    assert "no host spec" in proof_space(no_host)["offload"]
    tt = SearchSpace.for_job(_job(False, 4, 8, recipe="torchtitan-fsdp"))
    assert tt.off_axis == (0.0,)
    ds = SearchSpace.for_job(_job(False, 4, 8), emit="deepspeed", max_pp=1, max_mbs=1,
                             zero=(1, 2))
    assert ds.off_axis == (0.0, 1.0)
    job = _job(False, 12, 4, wide=True, batch=8)
    mg = SearchSpace.for_job(job, emit="megatron", max_pp=4, max_vpp=2, max_mbs=1,
                             zero=(0, 1, 3))
    ranked = _ranked_or_raise(job, mg)
    assert ranked and all(p.zero >= 1 for _, p in ranked if p.optimizer_offload)
    # without a framework, offload wins keys at zero 0, which Megatron's rows refuse
    free = SearchSpace.for_job(job, by_framework=False, max_pp=4, max_vpp=2, max_mbs=1,
                               zero=(0, 1, 3))
    assert any(p.optimizer_offload and p.zero == 0
               for _, p in _ranked_or_raise(job, free))


def test_small_hosts_leave_the_share_out() -> None:
    """A share whose whole-model host bytes exceed the node's host memory is not searched
    on that key (`host_ok`), and every plan searched fits its hosts."""
    job = _job(False, 4, 8, seq=8192, batch=8, host_gib=1.0)
    space = SearchSpace.for_job(job, fix="pp=1,zero=0,mbs=1", max_vpp=1)
    ranked = _ranked_or_raise(job, space)
    for _, p in ranked:
        need = p.optimizer_offload * model_host_bytes(
            job, p.tp, p.ep, p.etp, p.zero, p.dp, p.cp, 1, 4) * 8  # pp 1: every layer
        assert need <= 1.0 * 2**30
        assert evaluate(job, p).fits
    assert any(p.optimizer_offload == 0 for _, p in ranked)
    big = [x for x in OFFLOAD_SHARES if x > 0 and x * model_host_bytes(
        job, 1, 1, None, 0, 8, 1) * 8 > 2**30]
    assert big and all(p.optimizer_offload not in big for _, p in ranked if p.tp == 1)


def test_pins() -> None:
    """--fix optimizer_offload=x searches x alone; bad values, a cluster without hosts, a
    framework that does not run it, and a pinned activation offload are exit-2 errors."""
    job = _job(False, 4, 8, seq=16384, batch=8)
    space = SearchSpace.for_job(job, fix="optimizer_offload=0.5", max_pp=2, max_vpp=1,
                                max_mbs=1, zero=(1,))
    assert space.off_axis == (0.5,) and space.optimizer_offload == 0.5
    res = solve(job, space, top_k=2, time_limit=60, workers=1)
    assert res.plans and all(ev.plan.optimizer_offload == 0.5 for ev in res.plans)
    assert proof_space(space)["pins"]["optimizer_offload"] == 0.5
    for bad in ("optimizer_offload=1.5", "optimizer_offload=-0.1", "activation_offload=99"):
        with pytest.raises(UserError):
            SearchSpace.for_job(job, fix=bad)
    with pytest.raises(InputError, match="host"):
        SearchSpace.for_job(_job(False, 4, 8, hosts=False), fix="optimizer_offload=0.5")
    with pytest.raises(InputError, match="torchtitan"):
        SearchSpace.for_job(_job(False, 4, 8, recipe="torchtitan-fsdp"),
                            fix="optimizer_offload=1")
    with pytest.raises(InputError, match="deepspeed"):
        SearchSpace.for_job(_job(False, 4, 8), emit="deepspeed", fix="optimizer_offload=0.5",
                            zero=(1, 2))


def test_host_check_bounds_the_largest_stage() -> None:
    """`host_ok` charges the largest stage a partition of the key's pp can have, not the whole
    model: a host too small for the whole model's offloaded states at pp 1 takes the share at
    pp 4, and every plan searched there fits its hosts (evaluate's `host_fits`)."""
    from autoparallel_cp.cost.evaluate import host_fits
    from autoparallel_cp.cost.memory import stage_memory
    from autoparallel_cp.search.offload_axis import stage_layers_bound

    job = _job(False, 12, 8, seq=2048, batch=16, wide=True, host_gib=250.0)
    space = SearchSpace.for_job(job, fix="tp=1,cp=1,zero=0,mbs=1,optimizer_offload=1",
                                max_vpp=1)
    assert not space.host_ok(1, 1, 0, 8, 1)  # pp 1: all 12 layers on one stage
    assert stage_layers_bound(space, 4) == 9 and space.host_ok(1, 1, 0, 2, 1)  # pp 4
    ranked = _ranked_or_raise(job, space)
    assert ranked and {p.pp for _, p in ranked} >= {4} and 1 not in {p.pp for _, p in ranked}
    for _, p in ranked:
        assert host_fits(job, p, stage_memory(job, p))
