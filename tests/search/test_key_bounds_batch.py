"""`key_bounds` (the uncoupled per-key bound of many keys, numpy over each schedule class at
once) gives every key the float `key_bound` gives it alone, bit for bit, in any order of the
keys; and it stays below every key's exact best (the enumerator's) on a two-node-group space."""

from __future__ import annotations

import math
import random

import pytest
from test_cpsat_partition import _key, _mini, _mixed_small

from autoparallel_cp.search import enumerate as en
from autoparallel_cp.search.key_bounds import key_bound, key_bounds
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster


def _space(cluster: str, moe: bool, layers: int, seq: int, fix: str | None,
           partial: bool = True, uniform: bool = False, batch: int = 16) -> SearchSpace:
    c = _mixed_small() if cluster == "mixed" else load_cluster(cluster).take_gpus(8)
    job = Job(model=_mini(moe, layers), cluster=c, seq_len=seq, global_batch=batch)
    return SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3), fix=fix,
                               partial_recompute=partial,
                               partition="uniform" if uniform else "free")


SPACES = [
    ("mixed", False, 8, 4096, None, True, False),  # two node groups, every pp
    ("mixed", True, 8, 8192, None, True, False),  # two groups, MoE with a dense prefix
    ("mixed", False, 8, 4096, "tp=4,pp=4,stage_groups=1:0:0:1", True, False),  # pinned
    ("mixed", False, 8, 4096, "tp=4,stage_groups=1:0:1:0,stage_layers=2:2:2:2", False, False),
    ("dgx-a100-40g", True, 8, 32768, None, True, False),  # memory forces (partial) recompute
    ("dgx-a100-40g", False, 8, 32768, None, False, True),  # all-layer recompute, uniform
    ("dgx-a100-40g", False, 7, 4096, "chunk_layers=1:2:3:1,pp=2,vpp=2", True, False),
]


@pytest.mark.parametrize("cluster,moe,layers,seq,fix,partial,uniform", SPACES)
def test_batched_bound_equals_one_key_at_a_time(cluster: str, moe: bool, layers: int,
                                                seq: int, fix: str | None, partial: bool,
                                                uniform: bool) -> None:
    space = _space(cluster, moe, layers, seq, fix, partial, uniform)
    t = build_tables(space)
    table = build_key_table(t)
    keys = [table.key(i) for i in range(len(table))]
    assert len({(k.pp, k.vpp) for k in keys}) > 1 or fix  # several schedule classes
    one = [key_bound(t, k) for k in keys]
    assert key_bounds(t, keys) == one  # floats compared exactly (inf == inf)
    order = list(range(len(keys)))
    random.Random(7).shuffle(order)
    shuffled = key_bounds(t, [keys[i] for i in order])
    assert [shuffled[order.index(i)] for i in range(len(keys))] == one
    assert any(math.isfinite(v) for v in one)


def test_batched_bound_below_every_key_best_two_groups() -> None:
    """On two node groups (the A100 stages slower), every key's batched bound is <= the exact
    best step time of its key over every partition and placement the enumerator tries."""
    union = _space("mixed", False, 8, 4096, "tp=4", partial=True)
    for space in union.schedule_variants():  # each schedule sub-space has its own tables
        ranked, _ = en.enumerate_best(space)
        t = build_tables(space)
        keys = [_key(p) for _, p in ranked]
        got = key_bounds(t, keys)
        assert len(got) == len(ranked) > 10
        for (cost, plan), kb in zip(ranked, got, strict=True):
            assert kb <= cost, plan.short()


def test_between_runs_between_classes() -> None:
    """`between` (the solve's Ctrl-C check) runs once per schedule class, and what it raises
    stops the batch."""
    space = _space("mixed", False, 8, 4096, None)
    t = build_tables(space)
    table = build_key_table(t)
    keys = [table.key(i) for i in range(len(table))]
    calls: list[int] = []
    key_bounds(t, keys, between=lambda: calls.append(1))
    assert 1 < len(calls) < len(keys)

    def stop() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        key_bounds(t, keys, between=stop)


@pytest.mark.parametrize("cluster,moe,layers,seq,fix,partial,uniform", SPACES[:2] + SPACES[4:5])
def test_coef_arrays_equal_key_coefs(cluster: str, moe: bool, layers: int, seq: int,
                                     fix: str | None, partial: bool, uniform: bool) -> None:
    """The tables read for all keys at once (`coef_arrays`, numpy indexing) hold each key's
    `key_coefs` values exactly: ZeRO-3 terms only for ZeRO-3 keys, p2p only for pp > 1, the
    dense-prefix terms only on MoE models."""
    import numpy as np

    from autoparallel_cp.search.key_bounds import coef_arrays, key_coefs

    space = _space(cluster, moe, layers, seq, fix, partial, uniform)
    t = build_tables(space)
    table = build_key_table(t)
    keys = [table.key(i) for i in range(len(table))]
    got = coef_arrays(t, keys)
    assert {k.zero >= 3 for k in keys} == {True, False}
    for i, k in enumerate(keys):
        c = key_coefs(t, k)
        for name, arr in got.items():
            want = getattr(c, name)
            assert np.array_equal(arr[i], np.asarray(want, float)), (k, name)
