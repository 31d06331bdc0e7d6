"""cost/path_batch.py's `critical_paths` (the replay level by level, one column per set of
durations) gives `pipeline_sim.critical_path`'s chain for every set, on ZBV and DualPipeV
DAGs, with durations drawn to tie often (small integers, zeros: the first-slot rule on a tie)
and not (random floats), the seeds' rank times of search/cpsat_replay.py, and sets with a
negative length among them (those take `critical_path` itself)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel_cp.cost import pipeline_sim as ps
from autoparallel_cp.cost.path_batch import critical_paths


def _dur(p: int, times: list[float], share: dict[str, float]):  # type: ignore[no-untyped-def]
    return lambda k, s: 0.5 * times[s if s < p else 2 * p - 1 - s] * share[k]


@settings(max_examples=40, deadline=None)
@given(sched=st.sampled_from(["zbv", "dualpipev"]), p=st.integers(1, 7),
       m=st.integers(1, 40), seed=st.integers(0, 10**6), ties=st.booleans(),
       sets=st.integers(1, 6))
def test_the_batched_paths_are_critical_path(sched: str, p: int, m: int, seed: int,
                                             ties: bool, sets: int) -> None:
    try:
        dag = ps.v_dag(sched, p, m)
    except ValueError:  # too few micro-batches for the schedule
        return
    rnd = random.Random(seed)
    draw = (lambda: float(rnd.randint(0, 3))) if ties else (lambda: rnd.uniform(0.0, 3.0))
    durs = [_dur(p, [draw() for _ in range(p)], {"F": draw(), "I": draw(), "W": draw()})
            for _ in range(sets)]
    if rnd.random() < 0.3:  # a negative share: that set is replayed by the plain loop
        durs.insert(rnd.randrange(sets + 1), _dur(p, [1.0] * p, {"F": 1.0, "I": -0.5,
                                                                "W": 2.0}))
    assert critical_paths(dag, durs) == [ps.critical_path(dag, d) for d in durs]


def test_the_seeds_paths() -> None:
    """search/cpsat_replay.py's seeds: each rank in turn 1.25, the others 1.0."""
    for sched, p, m, split in [("zbv", 8, 32, (1.0, 1.0, 1.0)), ("dualpipev", 8, 40,
                                                                  (0.3, 0.45, 0.25)),
                               ("zbv", 16, 48, (0.32, 0.36, 0.32)),
                               ("dualpipev", 12, 30, (0.3, 0.4, 0.3))]:
        dag = ps.v_dag(sched, p, m)
        share = dict(zip("FIW", split, strict=True))
        durs = [_dur(p, [1.25 if j == r else 1.0 for j in range(p)], share) for r in range(p)]
        got = critical_paths(dag, durs)
        assert got == [ps.critical_path(dag, d) for d in durs]
        assert len({tuple(x) for x in got}) > 1  # the sets differ: not one path repeated
