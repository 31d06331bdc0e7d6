"""The per-key linear partition model (cpsat_partition) against exhaustive enumeration: for
every key of small spaces (dense, MoE with a dense prefix, ZeRO-3, interleaving, two node
groups) its best exact step time equals the enumerator's best plan of that key, up to the
model's proven error bound; the cutoff drops exactly the keys whose best is above it; the
master's bound stays below every key's best (with the DP-overlap bound on)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import (
    _key,
    _mini,
    _mixed_small,
    _pinned_lb,
    _ranked,
    _ranked_or_raise,
)

from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.search.cpsat_master import Key
from autoparallel_cp.search.cpsat_partition import solve_partition
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables
from autoparallel_cp.spec import Job, ModelSpec
from autoparallel_cp.spec.loaders import load_cluster


def _check_every_key(space: SearchSpace, stride: int = 1) -> int:
    """Per schedule sub-space (search/schedule_axis.py: each has its own tables)."""
    n = 0
    for sub in space.schedule_variants():
        n += _check_every_key_of(sub, stride, sub is space)
    return n


def _check_every_key_of(space: SearchSpace, stride: int, whole: bool) -> int:
    try:
        ranked = _ranked_or_raise(space.job, space)  # shared with `_check_key_bound_of`
    except InfeasibleError:
        if whole:
            raise
        return 0  # a zero-bubble sub-space where nothing fits
    t = build_tables(space)
    n = 0
    for cost, plan in ranked[::stride]:
        res = solve_partition(t, _key(plan), time_limit=30)
        assert res is not None, plan.short()
        step, got, diff, err = res
        assert got.key()[:10] == plan.key()[:10]
        assert step == pytest.approx(cost, abs=err + 1e-9), (plan.short(), got.short())
        assert step >= cost - 1e-9  # the enumerator's best of the key is the best
        assert diff + 1e-12 >= 0.0 and diff <= err + 1e-12
        # cutoff: just below the key's best drops it (up to the bound), at it keeps it
        assert solve_partition(t, _key(plan), cutoff_s=cost - err - 1e-6) is None
        kept = solve_partition(t, _key(plan), cutoff_s=cost + 1e-9)
        assert kept is not None and kept[0] == pytest.approx(cost, abs=err + 1e-9)
        n += 1
    return n


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([4, 6, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16]), zero=st.sampled_from([(0, 1), (1, 3)]))
def test_partition_model_equals_enumeration(moe: bool, layers: int, gpus: int, batch: int,
                                            zero: tuple[int, ...]) -> None:
    job = Job(model=_mini(moe, layers), cluster=load_cluster("dgx-a100-40g").take_gpus(gpus),
              seq_len=4096, global_batch=batch)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=zero)
    if space.num_degree_combinations() == 0:
        return
    _check_every_key(space, stride=5)


def test_partition_model_heterogeneous_equals_enumeration() -> None:
    job = Job(model=_mini(False, 6), cluster=_mixed_small(), seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3), fix="tp=8")
    assert _check_every_key(space, stride=3) > 0


def test_partition_model_is_deterministic() -> None:
    job = Job(model=_mini(True, 8), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)
    t = build_tables(space)
    key = Key(tp=1, cp=1, pp=4, dp=2, ep=2, vpp=1, sp=0, zero=1, mbs=1, m=8, mode=2)
    a = solve_partition(t, key)
    b = solve_partition(t, key)
    assert a is not None and b is not None
    assert a[1] == b[1] and a[0] == b[0]


def test_master_bound_below_every_key_best_heterogeneous_zero3() -> None:
    """LB(key) <= the exact best of the key, with ZeRO-3 and two node groups."""

    from autoparallel_cp.search.cpsat_master import build_master

    job = Job(model=_mini(False, 6), cluster=_mixed_small(), seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3), fix="tp=8")
    ranked = _ranked_or_raise(job, space)
    master = build_master(build_tables(space))
    for cost, plan in ranked[::3]:
        assert _pinned_lb(master, _key(plan)) * master.unit_s <= cost + 1e-9


def test_enumerate_keys_lists_every_key_in_the_window() -> None:
    """Every key whose pinned LB is <= hi is listed (CP-SAT's presolve once dropped some)."""

    from autoparallel_cp.search.cpsat_master import build_master, enumerate_keys

    job = Job(model=_mini(True, 6), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)
    master = build_master(build_tables(space))
    ranked = _ranked_or_raise(job, space)
    lbs = {}
    for _, plan in ranked[::4]:
        lbs[_key(plan)] = _pinned_lb(master, _key(plan))
    hi = sorted(lbs.values())[len(lbs) // 2]
    listed, capped = enumerate_keys(master, None, hi)
    assert not capped
    got = {k: v for v, k in listed}
    for k, v in lbs.items():
        if v <= hi:
            assert got.get(k) == v, k


def test_solve_is_deterministic() -> None:
    """Same input, same answer (plans and step times)."""
    from autoparallel_cp.search.solve import solve

    job = Job(model=_mini(True, 8), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)
    a = solve(job, space, top_k=5, time_limit=60, workers=2)
    b = solve(job, space, top_k=5, time_limit=60, workers=2)
    assert a.status == b.status == "optimal"
    assert [(c, p) for c, p in a.stats["ranked"]] == [(c, p) for c, p in b.stats["ranked"]]


def _check_key_bound(space: SearchSpace) -> int:
    """Per schedule sub-space (search/schedule_axis.py: each has its own tables)."""
    return sum(_check_key_bound_of(sub) for sub in space.schedule_variants())


def _check_key_bound_of(space: SearchSpace) -> int:
    from autoparallel_cp.search.key_bounds import key_bound

    ranked = _ranked(space)  # the best plan of every key, by exact step time (enumerate_best)
    t = build_tables(space)
    for cost, plan in ranked:  # the enumerator's best plan of every key
        kb = key_bound(t, _key(plan))
        tight = key_bound(t, _key(plan), coupled=True)  # T, S and the DP tail coupled
        assert kb <= cost, plan.short()
        assert tight <= cost, (plan.short(), tight, cost)
        assert tight >= kb * (1 - 1e-12), plan.short()  # the coupled bound is never looser
    return len(ranked)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(moe=st.booleans(), layers=st.sampled_from([4, 6, 8]), gpus=st.sampled_from([4, 8]),
       batch=st.sampled_from([8, 16]), zero=st.sampled_from([(0, 1), (1, 3)]),
       partial=st.booleans(), uniform=st.booleans(),
       cluster=st.sampled_from(["dgx-a100-40g", "dgx-h100"]))
def test_key_bound_below_every_key_best(moe: bool, layers: int, gpus: int, batch: int,
                                        zero: tuple[int, ...], partial: bool, uniform: bool,
                                        cluster: str) -> None:
    """The per-key bound (memory-forced recompute, edges, node-group split) never exceeds the
    exact best step time of its key: it only skips keys that cannot enter the top k."""
    job = Job(model=_mini(moe, layers), cluster=load_cluster(cluster).take_gpus(gpus),
              seq_len=4096, global_batch=batch)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=zero,
                                partial_recompute=partial,
                                partition="uniform" if uniform else "free")
    if space.num_degree_combinations() == 0:
        return
    _check_key_bound(space)


def test_key_bound_below_every_key_best_heterogeneous() -> None:
    job = Job(model=_mini(False, 8), cluster=_mixed_small(), seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3), fix="tp=8")
    assert _check_key_bound(space) > 0


@pytest.mark.parametrize("moe,layers,seq,fix,partial", [
    (False, 8, 4096, "tp=4", True),  # pp=4: two stages per group, partial recompute
    (True, 6, 4096, "tp=4", False),  # MoE with a dense prefix on the first stage
    (False, 8, 16384, "tp=2,pp=4", True),  # long sequences: memory forces recompute
    (False, 8, 4096, "tp=4,pp=4,stage_groups=1:0:0:1", True),  # a pinned placement
    (False, 8, 4096, "tp=4,stage_groups=1:0:1:0,stage_layers=2:2:2:2", False),
    (True, 6, 4096, "tp=4,pp=4,vpp=1,stage_groups=0:1:1:0,recompute_layers=1", True),
])
def test_key_bound_below_every_key_best_two_groups(moe: bool, layers: int, seq: int, fix: str,
                                                   partial: bool) -> None:
    """Two node groups (H100 and A100) with several stages per group: the bound's best
    placement (group 0 on the positions where it gains most; the pinned one when given), and
    the coupled bound with its per-stage DP tail, stay below the exact best of every key, over
    every placement the enumerator tries."""
    job = Job(model=_mini(moe, layers), cluster=_mixed_small(), seq_len=seq, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3), fix=fix,
                                partial_recompute=partial)
    assert _check_key_bound(space) > 0


def test_key_bound_below_every_key_best_memory_bound() -> None:
    """Long sequences on 40 GB GPUs: many keys only fit with (partial) full recompute, whose
    replay time the bound includes."""
    job = Job(model=_mini(True, 6), cluster=load_cluster("dgx-a100-40g").take_gpus(8),
              seq_len=32768, global_batch=8)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2)
    assert _check_key_bound(space) > 0


def test_key_bound_below_every_key_best_torchtitan_recipe() -> None:
    from autoparallel_cp.spec import RECIPES

    job = Job(model=_mini(False, 6), cluster=load_cluster("dgx-a100-40g").take_gpus(8),
              recipe=RECIPES["torchtitan-fsdp"], seq_len=8192, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3))
    assert _check_key_bound(space) > 0


def test_key_bound_and_partition_model_with_folding() -> None:
    """MoE parallel folding (--fix etp=1): the per-key bound stays below every key's exact
    best, and the partition model finds it, on layouts with ep > dp*cp."""
    from test_solver_vs_enumerate import _mini_folding

    job = Job(model=_mini_folding(6), cluster=load_cluster("dgx-h100").take_gpus(8),
              seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, fix="etp=1", max_pp=4, max_vpp=2, max_mbs=2,
                                zero=(1, 3))
    assert _check_key_bound(space) > 0
    assert _check_every_key(space, stride=7) > 0


@pytest.mark.parametrize("fix,layers,batch", [
    ("", 8, 12),  # interleaved keys with m % pp != 0 (Megatron's micro-batch groups)
    ("stage_layers=4:3,vpp=2", 7, 16),  # a pinned split with uneven chunks
    ("chunk_layers=1:2:3:1,pp=2,vpp=2", 7, 12),
])
def test_bounds_and_partition_model_for_megatron_splits(fix: str, layers: int,
                                                        batch: int) -> None:
    """key_bound <= every key's exact best, and the per-key model equals the enumeration, when
    the key's m is not a multiple of pp or the split is pinned with uneven chunks (each stage's
    own in-flight count: `stage_inflight`)."""
    job = Job(model=_mini(False, layers), cluster=load_cluster("dgx-a100-40g").take_gpus(8),
              seq_len=4096, global_batch=batch)
    space = SearchSpace.for_job(job, fix=fix or None, max_pp=4, max_vpp=2, max_mbs=2,
                                zero=(1, 3))
    assert any(d.vpp > 1 for d in space.degrees())
    if not fix:
        assert any(d.vpp > 1 and d.num_microbatches % d.pp for d in space.degrees())
    assert _check_key_bound(space) > 0
    assert _check_every_key(space, stride=2) > 0


def _mini_mtp(layers: int) -> ModelSpec:
    """The MoE mini model with one DeepSeek-V3 MTP depth (a MoE layer + head on the last
    stage)."""
    return _mini(True, layers).model_copy(update={"mtp_layers": 1})


@pytest.mark.parametrize("cluster,fix,stride,partial", [
    ("dgx-a100-40g", "", 3, True),  # one group: the flag with partial and uniform recompute
    ("mixed", "tp=4", 1, False),  # two groups: full recompute replays MTP on either group
])
def test_partition_model_and_bounds_with_mtp(cluster: str, fix: str, stride: int,
                                             partial: bool) -> None:
    """With MTP the per-key model (its replay flag: r >= every l_j), the enumerator and the
    bounds that leave the MTP terms out agree as without it: the model's best equals the
    enumerator's within its error bound and is never below it, and every bound stays below
    every key's best."""
    c = _mixed_small() if cluster == "mixed" else load_cluster(cluster).take_gpus(8)
    job = Job(model=_mini_mtp(6), cluster=c, seq_len=8192, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3), fix=fix,
                                partial_recompute=partial)
    assert _check_every_key(space, stride=stride) > 0
    assert _check_key_bound(space) > 0
