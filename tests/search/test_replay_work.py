"""Work the V search skips without changing an answer (issue 31, `--search-also schedule`
speed): a partition family whose proven bound is above the cutoff is not solved
(cpsat_partition.py `solve_partition_proven`), and a V key's trials start at the second margin
(replay_axis.py `trial_margins`); the plans stay the enumerator's and the default margins'."""

from __future__ import annotations

import math
from typing import Any

import pytest
from test_replay_search import _compare_exact
from test_zb_search import _job

from autoparallel_cp.search import cpsat_partition, replay_axis
from autoparallel_cp.search import solve as solve_mod
from autoparallel_cp.search.key_bounds import family_bounds
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables, key_variants


def _v_space(sched: str) -> tuple[Any, SearchSpace]:
    job = _job()
    return job, SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_vpp=4)


@pytest.mark.parametrize("sched", ["zbv", "dualpipev"])
def test_families_above_the_cutoff_are_not_solved(monkeypatch: pytest.MonkeyPatch,
                                                  sched: str) -> None:
    job, sp = _v_space(sched)
    t = build_tables(sp)
    calls: list[Any] = []
    real = cpsat_partition._solve_family

    def spy(tf: Any, key: Any, **kw: Any) -> Any:
        calls.append((tf.space.fixed_split, kw["cutoff_s"]))
        return real(tf, key, **kw)

    monkeypatch.setattr(cpsat_partition, "_solve_family", spy)
    seen = 0
    for d in sp.degrees():
        if d.pp == 1 or len(sp.split_families(d.pp, 2)) < 2:
            continue
        key = next(k for k in _keys(t, d))
        (v,) = key_variants(t, key)
        lbs = [b for b in family_bounds(v, key) if math.isfinite(b)]
        if len(lbs) < 2:
            continue
        # a cutoff below every family's bound: proven empty without one model
        calls.clear()
        res, proven = cpsat_partition.solve_partition_proven(t, key, cutoff_s=min(lbs) * 0.999)
        assert res is None and proven and calls == []
        # between the least and the largest bound: only the families at or below it
        cut = sorted(lbs)[-1] * 0.999
        calls.clear()
        res, _ = cpsat_partition.solve_partition_proven(t, key, cutoff_s=cut)
        assert 1 <= len(calls) < len(family_bounds(v, key))
        seen += 1
        if seen >= 3:
            break
    assert seen >= 1


def _keys(t: Any, d: Any) -> Any:
    """The partition keys of degrees `d` (every recompute mode, sp and zero of the space)."""
    from autoparallel_cp.search.key_table import build_key_table

    table = build_key_table(t)
    for i in range(len(table)):
        k = table.key(i)
        if (k.tp, k.pp, k.cp, k.dp, k.mbs) == (d.tp, d.pp, d.cp, d.dp, d.mbs):
            yield k


def test_v_trial_margins_skip_only_the_first() -> None:
    _, v = _v_space("zbv")
    m = solve_mod.TRIAL_MARGINS
    assert replay_axis.trial_margins(v, m) == m[1:]
    plain = SearchSpace.for_job(_job(), max_pp=4)
    assert replay_axis.trial_margins(plain, m) == m
    zb = SearchSpace.for_job(_job(), fix="schedule=zb-h1", max_pp=4)
    assert replay_axis.trial_margins(zb, m) == m


@pytest.mark.parametrize("sched", ["zbv", "dualpipev"])
def test_v_margins_give_the_default_margins_plans(monkeypatch: pytest.MonkeyPatch,
                                                  sched: str) -> None:
    job, sp = _v_space(sched)
    _compare_exact(job, sp, 4)  # CP-SAT == the enumerator with the V margins
    ours = solve_mod.solve(job, sp, top_k=4)
    monkeypatch.setattr(replay_axis, "trial_margins", lambda space, margins: margins)
    monkeypatch.setattr(solve_mod, "trial_margins", lambda space, margins: margins)
    default = solve_mod.solve(job, sp, top_k=4)
    assert [(e.plan, e.time.step_s) for e in ours.plans] == \
        [(e.plan, e.time.step_s) for e in default.plans]
    assert ours.stats["models"] <= default.stats["models"]
