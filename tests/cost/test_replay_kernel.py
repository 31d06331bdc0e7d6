"""The fast replay of cost/pipeline_sim.py (`Dag.slots`, `_ends`, `_back`) gives the same
floats, bit for bit, and the same longest path as the plain loop over every predecessor
(`_reference`, the replay as it was before the slots), with durations drawn to tie often
(small integers, zeros) and not (random floats), on ZBV and DualPipeV lists."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel_cp.cost import pipeline_sim as ps
from autoparallel_cp.cost.schedules import _v_span


def _reference(dag: ps.Dag, length: list[float]) -> tuple[list[float], list[int]]:
    """Every step's end and back-pointer from all of `dag.preds`: start 0, then the rank's
    previous step, then any input ending strictly later; end = start + the step's lengths
    summed from 0 in order."""
    end = [0.0] * len(dag.rank)
    came = [-1] * len(dag.rank)
    for n, (ks, preds, first) in enumerate(zip(dag.kidx, dag.preds, dag.first, strict=True)):
        start, by = 0.0, -1
        for i, x in enumerate(preds):
            if end[x] > start or (i == 0 and not first):
                start, by = end[x], x
        total = 0.0
        for k in ks:
            total += length[k]
        end[n] = start + total
        came[n] = by
    return end, came


def _dur(p: int, times: list[float], share: dict[str, float]):  # type: ignore[no-untyped-def]
    return lambda k, s: 0.5 * times[s if s < p else 2 * p - 1 - s] * share[k]


@settings(max_examples=60, deadline=None)
@given(sched=st.sampled_from(["zbv", "dualpipev"]), p=st.integers(1, 6),
       m=st.integers(1, 30), seed=st.integers(0, 10**6), ties=st.booleans())
def test_fast_replay_is_the_plain_replay(sched: str, p: int, m: int, seed: int,
                                         ties: bool) -> None:
    try:
        dag = ps.compile_dag(ps.v_orders(sched, p, m), 2 * p)
    except ValueError:  # too few micro-batches for the schedule: no DAG to replay
        return
    rnd = random.Random(seed)
    draw = (lambda: float(rnd.randint(0, 3))) if ties else (lambda: rnd.uniform(0.0, 3.0))
    times = [draw() for _ in range(p)]
    share = {"F": draw(), "I": draw(), "W": draw()}
    dur = _dur(p, times, share)
    end, came = _reference(dag, ps._lengths(dag, dur))
    want = max(end[x] if x >= 0 else 0.0 for x in dag.last)
    assert ps._span(dag, dur) == want
    assert ps.v_makespan(sched, p, m, dur) == want
    assert _v_span(sched, p, m, tuple(times), (share["F"], share["I"], share["W"])) == want
    last, back = ps._run(dag, dur)
    assert back == came
    assert last == [end[x] if x >= 0 else 0.0 for x in dag.last]


def test_slots_drop_only_inputs_on_the_steps_own_rank() -> None:
    """Slot 0 is the rank's previous step (0 on its first), the other slots every input on
    another rank; a negative duration takes the plain loop (the drop needs ends that never
    fall along a rank)."""
    for sched, p, m in (("zbv", 3, 7), ("dualpipev", 4, 9)):
        dag = ps.compile_dag(ps.v_orders(sched, p, m), 2 * p)
        for n, (pr, first) in enumerate(zip(dag.preds, dag.first, strict=True)):
            row = [sl[n] for sl in dag.slots]
            assert row[0] == (0 if first else pr[0] + 1)
            other = [x + 1 for x in (pr if first else pr[1:]) if dag.rank[x] != dag.rank[n]]
            assert [x for x in row[1:] if x] == other
        assert any(dag.rank[x] == dag.rank[n] for n, pr in enumerate(dag.preds) for x in pr[1:])
        times = [1.0] * p
        neg = {"F": 1.0, "I": -0.5, "W": 2.0}
        end, came = _reference(dag, ps._lengths(dag, _dur(p, times, neg)))
        assert ps._span(dag, _dur(p, times, neg)) == max(end[x] for x in dag.last)
        assert ps._run(dag, _dur(p, times, neg))[1] == came


@settings(max_examples=60, deadline=None)
@given(sched=st.sampled_from(["zbv", "dualpipev"]), p=st.integers(1, 7),
       m=st.integers(1, 30), seed=st.integers(0, 10**6), ties=st.booleans(),
       neg=st.booleans())
def test_the_chain_is_the_back_pointers_of_the_replay(sched: str, p: int, m: int, seed: int,
                                                      ties: bool, neg: bool) -> None:
    """`pipeline_sim.chain` (the ends of `_ends`, then only the chain's pointers found again)
    is the walk over `_run`'s back-pointers of every step (and `_reference`'s), from the first
    rank whose last step ends last; a negative share takes `_run`'s loop."""
    try:
        dag = ps.v_dag(sched, p, m)
    except ValueError:
        return
    rnd = random.Random(seed)
    draw = (lambda: float(rnd.randint(0, 3))) if ties else (lambda: rnd.uniform(0.0, 3.0))
    share = {"F": draw(), "I": -0.5 if neg else draw(), "W": draw()}
    dur = _dur(p, [draw() for _ in range(p)], share)
    end, came = _reference(dag, ps._lengths(dag, dur))
    last = [end[x] if x >= 0 else 0.0 for x in dag.last]
    at = dag.last[max(range(p), key=lambda r: last[r])]
    want = []
    while at >= 0:
        want.append(at)
        at = came[at]
    assert ps.chain(dag, dur) == want
