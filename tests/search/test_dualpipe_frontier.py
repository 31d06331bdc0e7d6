"""DualPipe's pair-sum classes found best-first (search/dualpipe_frontier.py): the frontier
yields exactly the listed classes with their bounds, in nondecreasing bound order, each node's
priority below every class under it; the class search forced through it equals the
enumerator's top k on random small spaces (one group and an H100 + A100 mix) and the listed
class search on llama3-70b at pp 4 and pp 8 and DeepSeek-V3 at pp 8; DeepSeek-V3 at pp 16
(~1e8 classes) is solved exactly, no worse than its named layout; out of budget it is
unproven with a valid error bound."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_dualpipe_classes import _variant
from test_replay_free_multi import _compare, _mixed_job
from test_zb_search import _job

from autoparallel_cp.api import make_job
from autoparallel_cp.errors import UserError
from autoparallel_cp.search import dualpipe_classes, replay_axis
from autoparallel_cp.search.dualpipe_classes import _Key, solve_by_class
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.model_scan import best_of_split
from autoparallel_cp.search.replay_axis import by_class, class_listed, num_classes
from autoparallel_cp.search.space import SearchSpace


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every DualPipe free family solved by class, its classes found best-first."""
    monkeypatch.setattr(replay_axis, "DUALPIPE_FREE_MAX", 0)
    monkeypatch.setattr(replay_axis, "DUALPIPE_CLASS_MAX", 0)


def _all(k: _Key) -> list[tuple[tuple[int, ...], float]]:
    """Every class the frontier yields, in its order."""
    out, n = [], 0
    while (got := k.at(n, Budget(None), math.inf)) is not None:
        assert not isinstance(got, float)
        out.append((tuple(int(x) for x in got[0]), got[1]))
        n += 1
    return out


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@example(mixed=False, moe=True, layers=12, pp=8, mode="full,recompute_layers=2")
@example(mixed=True, moe=False, layers=10, pp=4, mode="full,recompute_layers=3")
@given(mixed=st.booleans(), moe=st.booleans(), layers=st.sampled_from([10, 12, 14]),
       pp=st.sampled_from([4, 8]),
       mode=st.sampled_from(["none", "selective", "full", "full,recompute_layers=2"]))
def test_the_frontier_yields_the_listed_classes_in_bound_order(
        mixed: bool, moe: bool, layers: int, pp: int, mode: str) -> None:
    """Every class with a finite bound, once, with the listed search's bound bit for bit,
    bounds nondecreasing (within rounding); every node's priority <= each class below it
    (one group: one placement; the mix: six; a pinned recompute count: two counts)."""
    if mixed and pp > 4:
        return
    job = _mixed_job(layers, moe) if mixed else _job(moe, layers, 16, 4096, 32)
    try:
        v, key = _variant(job, f"schedule=dualpipe,pp={pp},tp=2,cp=1,mbs=1,zero=1,"
                          f"recompute={mode}", max_pp=pp)
    except (UserError, ValueError):
        return
    listed = _Key(v, key)
    assert len(listed.rls) == (2 if "layers" in mode else 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_axis, "DUALPIPE_CLASS_MAX", 0)
        k, fresh = _Key(v, key), _Key(v, key).frontier
    assert k.frontier is not None and fresh is not None and listed.frontier is None
    want = sorted((tuple(int(x) for x in s), float(b))
                  for s, b in zip(listed.classes[listed.order], listed.bounds, strict=True)
                  if math.isfinite(b))
    got = _all(k)
    assert sorted(got) == want
    bounds = [b for _, b in got]
    assert all(y >= x * (1 - 1e-12) for x, y in zip(bounds, bounds[1:], strict=False))
    # a fresh frontier: each popped node's priority <= every listed class under it
    cls = listed.classes
    b_all = np.full(len(cls), math.inf)
    b_all[listed.order] = listed.bounds
    for _ in range(40):
        if not fresh.heap:
            break
        p, done, s, R, acc = fresh.heap[0]
        under = np.all(cls[:, :len(s)] == np.array(s, np.int64), axis=1)
        assert np.all(b_all[under] >= p * (1 - 1e-12))
        fresh.at(len(fresh.items), Budget(None), math.inf)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@example(mixed=False, moe=True, layers=10, pp=8, tp=1, seq=4096)
@example(mixed=True, moe=True, layers=8, pp=4, tp=2, seq=2048)
@given(mixed=st.booleans(), moe=st.booleans(), layers=st.sampled_from([6, 8, 10]),
       pp=st.sampled_from([2, 4, 8]), tp=st.sampled_from([1, 2]),
       seq=st.sampled_from([2048, 8192]))
def test_best_first_equals_the_enumerator(forced: None, mixed: bool, moe: bool, layers: int,
                                          pp: int, tp: int, seq: int) -> None:
    """The class search through the frontier: top 3 == the enumerator's (the same exact
    floats, plans and placements), one node group and an H100 + A100 mix."""
    if mixed and pp > 4:
        return
    job = _mixed_job(layers, moe, seq) if mixed else _job(moe, layers, 8, seq, 32)
    try:
        space = SearchSpace.for_job(job, fix=f"schedule=dualpipe,pp={pp},tp={tp}",
                                    max_pp=pp, max_mbs=1, zero=(1,))
    except UserError:
        return
    if space.num_degree_combinations() == 0:
        return
    assert by_class(space, pp) and not class_listed(space, pp)
    _compare(job, space, 3)


def _both(v: Any, key: Any) -> tuple[Any, Any]:
    """The listed class search's answer and the best-first one's, on fresh caches."""
    listed = solve_by_class(v, key, cutoff_s=None, budget=Budget(None))
    assert v.__dict__["_dp_class"][key].frontier is None
    v.__dict__.pop("_dp_class", None)
    v.__dict__.pop("_dp_class_best", None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_axis, "DUALPIPE_CLASS_MAX", 0)
        first = solve_by_class(v, key, cutoff_s=None, budget=Budget(None))
    assert v.__dict__["_dp_class"][key].frontier is not None
    return listed, first


def _same(a: Any, b: Any) -> None:
    """The same (step, plan, gap to its class's bound, error bound) and proof flag."""
    assert (a[0] is None) == (b[0] is None) and a[1] == b[1]
    if a[0] is not None:
        assert a[0][0] == b[0][0] and a[0][1].key() == b[0][1].key()
        assert a[0][2:] == b[0][2:]


@pytest.mark.parametrize("pp", [4, 8])
def test_llama3_70b_80_layers_equals_the_listed_class_search(pp: int) -> None:
    """llama3-70b on 512 H100 (80 layers), every key at pp 4 and 8 (77 and 67,525 classes):
    best-first gives the listed search's answer bit for bit."""
    job = make_job("llama3-70b", "dgx-h100", gpus=512, seq_len=8192, global_batch=512)
    for mode in ("none", "full"):
        v, key = _variant(job, f"schedule=dualpipe,pp={pp},tp=4,cp=2,mbs=1,zero=1,"
                          f"recompute={mode}")
        a, b = _both(v, key)
        assert a[0] is not None
        _same(a, b)


def _deepseek(pp: int, zero: int = 1) -> tuple[Any, Any]:
    """DeepSeek-V3 (61 layers, 3 dense) on 2048 H800, the DualPipe key of the paper's
    degrees at pp (tp 1, ep 64, mbs 1, selective recompute)."""
    job = make_job("deepseek-v3", "dgx-h800", gpus=2048, seq_len=4096, global_batch=15360,
                   recipe="deepseek-v3-fp8")
    return _variant(job, f"schedule=dualpipe,tp=1,pp={pp},cp=1,ep=64,mbs=1,zero={zero},"
                    "recompute=selective")


def test_deepseek_v3_pp8_equals_the_listed_class_search() -> None:
    """DeepSeek-V3 at pp 8, ZeRO-2 (its prefix held whole on stage 0): best-first ==
    listed."""
    v, key = _deepseek(8, 2)
    assert class_listed(v.space, 8)
    a, b = _both(v, key)
    assert a[0] is not None
    _same(a, b)


def test_deepseek_v3_pp16_is_searched_exactly() -> None:
    """DeepSeek-V3 at pp 16 (~1e8 classes, not listed): proven, its plan scored by the cost
    model to the same float, no slower than the published layout 3:4:..:4:2 (whose class,
    pair sums (5, 8, .., 8), it opens), every stage >= 1 and the prefix whole on stage 0."""
    v, key = _deepseek(16)
    assert by_class(v.space, 16) and not class_listed(v.space, 16)
    assert num_classes(v.space, 16) > 10**7
    got, _ = solve_by_class(v, key, cutoff_s=None, budget=Budget(None))
    assert got is not None and got[3] == 0.0
    split = got[1].layers_per_stage(61)
    assert sum(split) == 61 and min(split) >= 1 and split[0] >= 3
    one = best_of_split(v, key, split)
    assert one is not None and one[0] == got[0]
    paper = best_of_split(v, key, (3,) + (4,) * 14 + (2,))
    assert paper is not None and got[0] <= paper[0]


def test_out_of_budget_is_unproven_and_bounded(forced: None) -> None:
    """Budget spent early: the best so far (or none), unproven, its error bound covering the
    gap to the exact best; a cutoff below the best proves the family empty."""
    v, key = _deepseek(16)
    want, _ = solve_by_class(v, key, cutoff_s=None, budget=Budget(None))
    fresh, _ = _deepseek(16)
    budget = Budget(None)
    budget.dtime = dualpipe_classes.limits.MODEL_PLAN_DTIME / 2
    part, proven = solve_by_class(fresh, key, cutoff_s=None, budget=budget)
    assert want is not None and not proven
    if part is not None:
        assert part[0] >= want[0] and part[0] - part[3] <= want[0] * (1 + 1e-12)
    below, proven = solve_by_class(v, key, cutoff_s=want[0] * 0.999, budget=Budget(None))
    assert below is None and proven
