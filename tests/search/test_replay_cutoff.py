"""The cutoff of a pinned V key's scan (search/enumerate.py `best_of_pinned_split`,
`_replayed`) and the replay's one-path bound it skips plans by (cost/replay_bound.py): the
bound is <= the replayed span bit for bit and equals it at the durations its path was taken
at; with a cutoff the scan returns the same plan and cost wherever the key's best is <= the
cutoff (ties included), and None or a cost above it otherwise, replaying fewer plans."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_solver_vs_enumerate import _key
from test_zb_search import _job

from autoparallel_cp.cost import pipeline_sim as ps
from autoparallel_cp.cost.replay_bound import span_floor
from autoparallel_cp.search import enumerate as en
from autoparallel_cp.search.solve import enumerate_plans
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.tables import build_tables


@settings(max_examples=60, deadline=None)
@given(sched=st.sampled_from(["zbv", "dualpipev"]), p=st.integers(2, 6),
       m=st.integers(1, 40), seed=st.integers(0, 10**6))
def test_the_one_path_bound_is_below_the_span_in_floats(sched: str, p: int, m: int,
                                                         seed: int) -> None:
    try:
        ps.v_dag(sched, p, m)
    except ValueError:  # too few micro-batches for the schedule
        return
    rnd = random.Random(seed)
    times = [rnd.uniform(0.0, 3.0) for _ in range(p)]
    share = {"F": rnd.random(), "I": rnd.random(), "W": rnd.random()}

    def dur(k: str, s: int) -> float:
        return 0.5 * times[s if s < p else 2 * p - 1 - s] * share[k]

    assert span_floor(sched, p, m, dur) <= ps.v_makespan(sched, p, m, dur)
    ones = lambda k, s: 1.0  # noqa: E731  (the witness path's own durations: exact)
    assert span_floor(sched, p, m, ones) == ps.v_makespan(sched, p, m, ones)


@pytest.mark.parametrize("sched", ["zbv", "dualpipev"])
def test_a_pinned_v_scan_under_a_cutoff_is_exact_up_to_it(sched: str,
                                                          monkeypatch: Any) -> None:
    job = _job(layers=8, gpus=8, batch=32)
    sp = SearchSpace.for_job(job, fix=f"schedule={sched}", max_pp=4, max_vpp=4)
    calls = [0]
    real = en.replay_bubble

    def counted(*a: Any) -> float:
        calls[0] += 1
        return real(*a)

    monkeypatch.setattr(en, "replay_bubble", counted)
    checked = skipped = 0
    for pp in sorted({d.pp for d in sp.degrees()}):
        for fam in sp.split_families(pp, 2)[1:]:  # the named layouts: pinned splits
            t = build_tables(fam)
            for res in enumerate_plans(job, fam, top_k=40).plans[::3]:
                key = _key(res.plan)
                exact = en.best_of_pinned_split(t, key)
                assert exact is not None
                for cut in (exact[0], math.nextafter(exact[0], math.inf), exact[0] * 1.02):
                    got = en.best_of_pinned_split(t, key, cut)
                    assert got is not None and got[0] == exact[0] and got[1] == exact[1]
                n0 = calls[0]
                en.best_of_pinned_split(t, key)
                full = calls[0] - n0
                for cut in (math.nextafter(exact[0], -math.inf), exact[0] * 0.98):
                    n0 = calls[0]
                    got = en.best_of_pinned_split(t, key, cut)
                    assert got is None or got[0] > cut
                    skipped += full - (calls[0] - n0)
                checked += 1
    assert checked >= 4
    assert skipped > 0  # the bound skipped replays below some cutoff (it is not vacuous)
