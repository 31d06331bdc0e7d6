"""`key_bound` with the last stage's DeepSeek-V3 MTP terms (search/key_bounds.py): on MoE models
with one MTP depth, on one and on two node groups, every key's bound (uncoupled and coupled) is
<= the enumerator's exact best of that key, the batched bound equals the one-key bound bit for
bit, and the bound is strictly above the one that leaves the MTP terms out (the same model's
bound without MTP, which main used before) on at least one key."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from test_cpsat_partition import _key, _mini, _mixed_small

from autoparallel_cp.search import enumerate as en
from autoparallel_cp.search.key_bounds import coef_arrays, key_bound, key_bounds, key_coefs
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.mtp_coefs import mtp_coefs
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster


def _space(cluster: str, seq: int, fix: str | None, partial: bool, mtp: int = 1,
           uniform: bool = False) -> SearchSpace:
    c = _mixed_small() if cluster == "mixed" else load_cluster(cluster).take_gpus(8)
    model = _mini(True, 6).model_copy(update={"mtp_layers": mtp})
    job = Job(model=model, cluster=c, seq_len=seq, global_batch=16)
    return SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(1, 3), fix=fix,
                               partial_recompute=partial,
                               partition="uniform" if uniform else "free")


SPACES = [
    ("dgx-a100-40g", 8192, None, True, False),  # one group, partial recompute (closed form)
    ("dgx-a100-40g", 32768, None, True, False),  # memory forces partial recompute
    ("dgx-a100-40g", 32768, None, False, True),  # one group, memory-bound, whole-stage recompute
    ("mixed", 8192, "tp=4", False, False),  # two node groups
    ("mixed", 8192, "tp=4,pp=4,stage_groups=1:0:0:1", True, False),  # two groups, pinned
]


@pytest.mark.parametrize("cluster,seq,fix,partial,uniform", SPACES)
def test_mtp_bound_batched_equals_one_key(cluster: str, seq: int, fix: str | None,
                                          partial: bool, uniform: bool) -> None:
    """Batched (`coef_arrays`, numpy over a schedule class) and one-key bounds agree exactly
    with the MTP terms, and the MTP coefficients read for all keys at once are each key's."""
    t = build_tables(_space(cluster, seq, fix, partial, uniform=uniform))
    table = build_key_table(t)
    keys = [table.key(i) for i in range(len(table))]
    got = coef_arrays(t, keys)
    for i, k in enumerate(keys):
        mc = mtp_coefs(t, k)
        assert mc is not None
        c = key_coefs(t, k)
        for name in ("time", "rec", "act", "ckpt", "states", "dps", "opt"):
            want = np.asarray(getattr(mc, name), float)
            assert np.array_equal(np.asarray(getattr(c, "mtp_" + name), float), want)
            assert np.array_equal(got["mtp_" + name][i], want), (k, name)
    one = [key_bound(t, k) for k in keys]
    order = list(range(len(keys)))
    random.Random(3).shuffle(order)
    shuffled = key_bounds(t, [keys[i] for i in order])
    assert [shuffled[order.index(i)] for i in range(len(keys))] == one
    assert any(math.isfinite(v) for v in one)


@pytest.mark.parametrize("cluster,seq,fix,partial,uniform", SPACES)
def test_mtp_bound_below_every_key_best_and_tighter(cluster: str, seq: int, fix: str | None,
                                                    partial: bool, uniform: bool) -> None:
    """bound <= the exact best of every key (the enumerator's, MTP costed), coupled too; and
    above the bound of the model without MTP (the MTP terms left out) on some key."""
    # the default schedules' sub-space (the ZB ones' bounds: tests/search/test_zb_search.py,
    # test_schedule_union.py)
    space = _space(cluster, seq, fix, partial, uniform=uniform).schedule_variants()[0]
    ranked, _ = en.enumerate_best(space)
    t = build_tables(space)
    t0 = build_tables(_space(cluster, seq, fix, partial, mtp=0,
                             uniform=uniform).schedule_variants()[0])
    assert t.mtp == 1 and t0.mtp == 0
    keys = [_key(p) for _, p in ranked]
    kb = key_bounds(t, keys)
    kb0 = key_bounds(t0, keys)
    assert len(ranked) > 5
    tighter = 0
    for (cost, plan), b, b0, k in zip(ranked, kb, kb0, keys, strict=True):
        assert b <= cost, plan.short()
        tight = key_bound(t, k, coupled=True)
        assert b * (1 - 1e-12) <= tight <= cost, (plan.short(), tight, cost)
        tighter += b > b0
    assert tighter > 0
