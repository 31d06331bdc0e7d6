"""The vectorized enumerator returns exactly what a plain loop over `tables.plan_cost` returns:
the same best plan per key, the same float step times (bit for bit), in the same order."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

from autoparallel_cp.search.enumerate import SpaceTooLarge, enumerate_best
from autoparallel_cp.search.enumerate_axes import (
    partition_array,
    partitions,
    placements,
    recompute_options,
)
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables, plan_cost
from autoparallel_cp.spec import ClusterSpec, Job, ModelSpec
from autoparallel_cp.spec.loaders import load_cluster, load_model
from autoparallel_cp.spec.plan import Plan


def _enumerate_loop(space: SearchSpace) -> list[tuple[float, Plan]]:
    """The reference: every plan through plan_cost, best per key, sorted by (cost, key); the
    partitions of every family (the space's own, then each named layout pinned)."""
    tabs = build_tables(space)
    best: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], Plan]] = {}
    for sv, d, fam in ((v, x, f) for v in space.etp_variants() for x in v.degrees()
                       for f in v.split_families(x.pp, x.vpp)):
        parts = list(partitions(fam, d.pp, d.vpp))
        places = list(placements(fam, d))
        cl = fam.fixed.get("chunk_layers")
        for sp_, zero, mode in itertools.product(space.sp, space.zero, space.recompute):
            if not sv.etp_legal(d.tp, d.cp, d.dp, d.ep, sp_) \
                    or not sv.host_ok(d.tp, d.ep, zero, d.dp, d.cp):
                continue  # (and the offload share's host check, search/offload_axis.py)
            key = (d.tp, d.pp, d.cp, d.dp, d.ep, d.vpp, sp_, zero, d.mbs, mode)
            for part in parts:
                ls = part if part is not None else (space.num_layers // d.pp,) * d.pp
                for r in recompute_options(space, mode, max(ls)):
                    for sg in places:
                        plan = Plan(dp=d.dp, tp=d.tp, pp=d.pp, vpp=d.vpp, cp=d.cp, ep=d.ep,
                                    sp=sp_, zero=zero, mbs=d.mbs,
                                    num_microbatches=d.num_microbatches, recompute=mode,
                                    recompute_layers=r, stage_layers=part, stage_groups=sg,
                                    chunk_layers=None if cl is None else tuple(cl),
                                    etp=sv.etp, optimizer_offload=sv.optimizer_offload)
                        pc = plan_cost(tabs, plan)
                        if not pc.fits:
                            continue
                        cand = (pc.step_s, plan.key(), plan)
                        old = best.get(key)
                        if old is None or cand[:2] < old[:2]:
                            best[key] = cand
    ranked = sorted(best.values(), key=lambda x: (x[0], x[1]))
    return [(c, p) for c, _, p in ranked]


def _dense(layers: int) -> ModelSpec:
    return load_model("llama3-8b").model_copy(update={"num_layers": layers})


def _moe(layers: int, dense_prefix: int) -> ModelSpec:
    m = load_model("mixtral-8x7b")
    assert m.moe is not None
    moe = m.moe.model_copy(update={"first_k_dense_layers": dense_prefix})
    return m.model_copy(update={"num_layers": layers, "moe": moe})


def _hetero(nodes: int = 1) -> ClusterSpec:
    c = load_cluster("mixed-h100-a100")
    return c.model_copy(update={"node_groups": [
        g.model_copy(update={"num_nodes": nodes}) for g in c.node_groups]})


def _check(space: SearchSpace) -> int:
    got, size = enumerate_best(space)
    want = _enumerate_loop(space)
    assert size == space.size()
    assert [c for c, _ in got] == [c for c, _ in want]  # exact floats
    assert [p for _, p in got] == [p for _, p in want]
    return len(want)


def _random_space(seed: int) -> SearchSpace:
    """A small space: dense / MoE-with-dense-prefix model, homogeneous / 2-group cluster."""
    rng = random.Random(seed)
    hetero = seed % 3 == 2
    model = _dense(rng.choice([6, 8])) if seed % 3 == 0 else (
        _moe(rng.choice([6, 8]), rng.choice([1, 2, 3])) if seed % 3 == 1 else _dense(8))
    cluster = _hetero() if hetero else load_cluster("dgx-h100").take_gpus(rng.choice([4, 8]))
    job = Job(model=model, cluster=cluster, seq_len=rng.choice([1024, 2048]),
              global_batch=rng.choice([8, 16, 32]))
    fix: dict[str, Any] = {"mbs": rng.choice([1, 2])}
    if hetero:
        fix["cp"] = 1
        fix["tp"] = rng.choice([2, 4])
    if rng.random() < 0.3:
        fix["recompute_layers"] = rng.choice([0, 1, 2, 3])
    zero = tuple(sorted(rng.sample([0, 1, 2, 3], rng.choice([2, 4]))))
    return SearchSpace.for_job(job, fix=fix, zero=zero, max_pp=4, max_vpp=rng.choice([1, 2]),
                               max_cp=2, partition="free",
                               partial_recompute=rng.random() < 0.8)


@pytest.mark.parametrize("seed", range(6))
def test_random_spaces_match_loop(seed: int) -> None:
    space = _random_space(seed)
    assert space.size() < 40_000
    _check(space)


def test_dense_free_partial() -> None:
    job = Job(model=_dense(8), cluster=load_cluster("dgx-h100").take_gpus(8), seq_len=2048,
              global_batch=16)
    space = SearchSpace.for_job(job, fix="mbs=1,cp=1", max_pp=4, max_vpp=2)
    assert _check(space) > 0


def test_moe_dense_prefix() -> None:
    # a first stage holding exactly the dense prefix (no MoE layer on it) is among the plans
    job = Job(model=_moe(6, 2), cluster=load_cluster("dgx-h100").take_gpus(8), seq_len=1024,
              global_batch=16)
    space = SearchSpace.for_job(job, fix="mbs=1,cp=1,tp=2", max_pp=4, max_vpp=2)
    assert _check(space) > 0
    uni = SearchSpace.for_job(job, fix="mbs=1,cp=1", partition="uniform", max_pp=4)
    assert _check(uni) > 0


def test_heterogeneous_two_groups() -> None:
    job = Job(model=_dense(8), cluster=_hetero(), seq_len=2048, global_batch=32)
    space = SearchSpace.for_job(job, fix="mbs=1,cp=1,zero=1", max_pp=4, max_vpp=2)
    assert space.heterogeneous
    assert _check(space) > 0
    pinned = SearchSpace.for_job(job, fix="mbs=1,cp=1,tp=4,pp=4,stage_layers=3:2:2:1,"
                                 "stage_groups=1:0:1:0,recompute_layers=2")
    assert _check(pinned) > 0


def test_partition_array_matches_generator() -> None:
    for model in (_dense(12), _moe(12, 3)):
        job = Job(model=model, cluster=load_cluster("dgx-h100").take_gpus(8), seq_len=1024,
                  global_batch=16)
        space = SearchSpace.for_job(job, max_pp=8, max_vpp=3)
        for pp, vpp in itertools.product((1, 2, 4, 8), (1, 2, 3)):
            arr, _ = partition_array(space, pp, vpp)
            ref = list(partitions(space, pp, vpp))
            assert [tuple(r) for r in arr.tolist()] == ref
            assert len(ref) == space.num_partitions(pp, vpp) or not ref
            assert arr.dtype == np.int64


def test_limit_refusal() -> None:
    job = Job(model=_dense(8), cluster=load_cluster("dgx-h100").take_gpus(8), seq_len=2048,
              global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4)
    with pytest.raises(SpaceTooLarge, match="refuses a space of"):
        enumerate_best(space, limit=10)
