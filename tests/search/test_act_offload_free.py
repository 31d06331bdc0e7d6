"""Free per-stage counts under a pinned activation offload (search/act_offload_free.py): the
model's objective and the key's bound below every free split's exact step, a free uneven
split found that beats every named and uniform split, and a mutated (too large) bound
caught."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from test_offload_search import _job

from autoparallel_cp.search import act_offload_bound
from autoparallel_cp.search.act_offload import free_at, stage_min
from autoparallel_cp.search.act_offload_bound import offload_key_bound
from autoparallel_cp.search.act_offload_free import build
from autoparallel_cp.search.enumerate_axes import partition_array
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.model_scan import best_of_split
from autoparallel_cp.search.solve import solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables, family_tables
from autoparallel_cp.spec.splits import named_layouts


def _free_parts(layers: int, k: int, pp: int, vpp: int, seq: int) -> list[Any]:
    job = _job(False, layers, 8, seq).model_copy(update={"search_also": ()})
    sp = SearchSpace.for_job(job, fix={"activation_offload": k, "pp": pp, "vpp": vpp},
                             max_mbs=2, zero=(0, 1))
    return [v for v in sp.schedule_variants() if free_at(v, pp, vpp)]


def _check_bounds(layers: int, k: int, pp: int, vpp: int, seq: int) -> int:
    """Every key's model objective at each free split and its key bound <= the split's
    exact best; the number of (key, split) pairs checked."""
    n = 0
    for sub in _free_parts(layers, k, pp, vpp, seq):
        t = build_tables(sub)
        kt = build_key_table(t)
        keys = [kt.key(i) for i in range(len(kt))]
        keys = [q for q in keys if q.pp == pp and q.vpp == vpp]
        for key in keys[::max(1, len(keys) // 6)]:
            (ft,) = [f for f in family_tables(t, key.pp, key.vpp) if free_at(f.space, pp, vpp)]
            om = build(ft, key)
            assert om is not None
            rows, _ = partition_array(ft.space, pp, vpp)
            kb = offload_key_bound(ft, key)
            for row in rows:
                if min(row) < k:
                    continue
                got = best_of_split(ft, key, tuple(int(x) for x in row))
                exact = math.inf if got is None else got[0]
                m = om.model.clone()
                for x, v in zip(om.layers, row, strict=True):
                    m.add(x == int(v))
                s = cp_model.CpSolver()
                s.parameters.num_workers = 1
                assert s.solve(m) == cp_model.OPTIMAL
                assert s.objective_value * om.scale_s <= exact + 1e-12, (key, row)
                assert kb <= exact + 1e-12, (key, row)
                n += 1
    return n


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.sampled_from([8, 12]), k=st.integers(1, 3), pp=st.sampled_from([2, 4]),
       vpp=st.sampled_from([1, 2]), seq=st.sampled_from([8192, 32768]))
def test_model_and_key_bound_below_every_free_split(layers: int, k: int, pp: int, vpp: int,
                                                    seq: int) -> None:
    """The module docstring's bound: objective·q/W and `StageCoefs.free_value` <= the exact
    best of every free split (stages >= k) of every key checked."""
    if pp * max(k, vpp) > layers:
        return
    _check_bounds(layers, k, pp, vpp, seq)


def test_a_too_large_bound_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above fails on a mutated bound (the pipeline coefficient m instead of
    m - rho'/vpp, times 1.5): the test can fail."""
    assert _check_bounds(8, 2, 2, 1, 8192) == 30  # unmutated: 5 keys x 6 splits hold
    orig = act_offload_bound.stage_coefs

    def big(t: Any, key: Any, g: int = 0) -> Any:
        sc = orig(t, key, g)
        return type(sc)(sc.time, sc.dsync, sc.opt, 1.5 * key.m, sc.b, sc.tail, sc.dense)

    monkeypatch.setattr(act_offload_bound, "stage_coefs", big)
    monkeypatch.setattr("autoparallel_cp.search.act_offload_free.stage_coefs", big)
    with pytest.raises(AssertionError):
        _check_bounds(8, 2, 2, 1, 8192)


def test_a_free_split_beats_every_named_split() -> None:
    """16 mini layers on 8 A100, seq 8192, `--fix activation_offload=2,pp=4` under 1F1B:
    the best plan's split (4, 5, 5, 2) is neither uniform nor a named layout, and is faster
    than the best named / uniform split (4, 5, 4, 3) by > 2%. Why (hand check): the LM head
    of this small-hidden, 32k-vocab model costs about two layers, so the last stage wants
    about two fewer layers (the named layouts count it as one), and (5, 5, 5, 1) is refused:
    every stage must hold >= k = 2 layers."""
    job = _job(False, 16, 8, 8192).model_copy(update={"search_also": ()})
    fix = {"activation_offload": 2, "pp": 4, "recompute": "none", "vpp": 1}
    space = SearchSpace.for_job(job, fix=fix, max_mbs=2, zero=(0, 1))
    best = solve(job, space, top_k=1).plans[0]
    split = best.plan.layers_per_stage(16)
    assert split == (4, 5, 5, 2) and min(split) >= 2
    assert split not in {tuple(sum(cl[j::4]) for j in range(4)) for cl in named_layouts(16, 4, 1)}
    named = SearchSpace.for_job(job, fix={**fix, "chunk_layers": (4, 5, 4, 3)}, max_mbs=2,
                                zero=(0, 1))
    other = solve(job, named, top_k=1).plans[0]
    assert best.time.step_s < 0.98 * other.time.step_s
    assert stage_min(space.schedule_variants()[0], 1) == (2, 2)
