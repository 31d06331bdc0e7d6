"""cost/step_dag.py's `compile_dag` (integer tokens, one producer per token, the sweep over
integers, the fields read off with numpy) is the plain sweep over action tuples
(`_reference`: the implementation it replaced, kept here) field for field, on ZBV and
DualPipeV lists of many (p, m), on hand-made lists (unknown kinds, a rank with no step, a
single rank), and raises where the plain sweep deadlocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel_cp.cost import pipeline_sim as ps
from autoparallel_cp.cost.step_dag import Action, Step, compile_dag

FIELDS = ("rank", "parts", "preds", "first", "last", "uniq", "kidx", "shapes", "shape", "slots")


def _reference(orders: Sequence[Sequence[Step]], stages: int) -> dict[str, Any]:
    """The plain sweep (pipeline_sim.compile_dag before the integer tokens)."""
    done: dict[Action, int] = {}
    rank: list[int] = []
    parts_l: list[tuple[Action, ...]] = []
    preds: list[tuple[int, ...]] = []
    first: list[bool] = []
    last = [-1] * len(orders)
    idx = [0] * len(orders)
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r, order in enumerate(orders):
            while idx[r] < len(order):
                parts = tuple(ps.step_actions(order[idx[r]]))
                need = [d for a in parts for d in ps.dependencies(a, stages)]
                if any(d not in done for d in need):
                    break
                n = len(rank)
                rank.append(r)
                parts_l.append(parts)
                preds.append(((last[r],) if idx[r] else ()) + tuple(done[d] for d in need))
                first.append(idx[r] == 0)
                for a in parts:
                    for x in ps.produces(a):
                        done[x] = n
                last[r] = n
                idx[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError("pipeline schedule deadlocks: an action waits on one never run")
    pos: dict[tuple[str, int], int] = {}
    kidx = tuple(tuple(pos.setdefault((k, st), len(pos)) for k, st, _ in ps_) for ps_ in parts_l)
    shapes: dict[tuple[int, ...], int] = {}
    shape = tuple(shapes.setdefault(ks, len(shapes)) for ks in kidx)
    rows = [((pr[0] + 1,) if not f else (0,))
            + tuple(x + 1 for x in pr[0 if f else 1:] if rank[x] != r)
            for r, pr, f in zip(rank, preds, first, strict=True)]
    k = max((len(row) for row in rows), default=1)
    slots = tuple(tuple(row[j] if j < len(row) else 0 for row in rows) for j in range(k))
    return dict(zip(FIELDS, (tuple(rank), tuple(parts_l), tuple(preds), tuple(first),
                             tuple(last), tuple(pos), kidx, tuple(shapes), shape, slots),
                    strict=True))


def _same(orders: Sequence[Sequence[Step]], stages: int) -> None:
    try:
        want = _reference(orders, stages)
    except ValueError:
        with pytest.raises(ValueError):
            compile_dag(orders, stages)
        return
    got = compile_dag(orders, stages)
    for f in FIELDS:
        assert getattr(got, f) == want[f], f


@pytest.mark.parametrize("sched", ["zbv", "dualpipev"])
@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 3), (2, 4), (3, 7), (4, 8), (4, 9),
                                 (5, 17), (6, 40), (8, 16), (8, 33), (16, 48)])
def test_the_dag_is_the_plain_sweeps(sched: str, p: int, m: int) -> None:
    _same(ps.v_orders(sched, p, m), 2 * p)


@settings(max_examples=40, deadline=None)
@given(sched=st.sampled_from(["zbv", "dualpipev"]), p=st.integers(1, 7),
       m=st.integers(1, 45))
def test_the_dag_is_the_plain_sweeps_on_drawn_lists(sched: str, p: int, m: int) -> None:
    _same(ps.v_orders(sched, p, m), 2 * p)


def test_hand_made_lists() -> None:
    """An unknown kind (waits on its own I, as W), a rank with no step, one rank, an empty
    list, an FB pair on one stage's F and B, 1F1B-like lists over 2 ranks."""
    _same([[("F", 0, 0), ("I", 0, 0), ("X", 0, 0), ("W", 0, 0)]], 1)
    _same([[("F", 0, 0), ("F", 1, 0), ("B", 1, 0), ("I", 0, 0), ("W", 0, 0)], []], 2)
    _same([[], [("F", 0, 0), ("I", 0, 0)]], 1)
    _same([[], []], 2)
    _same([], 1)
    _same([[("F", 0, 0), ("F", 0, 1), ("FB", ("F", 0, 2), ("B", 0, 0)), ("B", 0, 1),
            ("B", 0, 2)]], 1)
    one_f_one_b = [[("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("F", 0, 2), ("B", 0, 1),
                    ("B", 0, 2)],
                   [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1), ("F", 1, 2),
                    ("B", 1, 2)]]
    _same(one_f_one_b, 2)
    _same([[("F", 0, 3), ("F", 0, 5)], [("F", 1, 5), ("F", 1, 3), ("I", 1, 3)]], 2)


def test_deadlocks_raise_as_the_plain_sweep() -> None:
    for orders, stages in [([[("I", 0, 0)]], 1),  # an input never made
                           ([[("I", 0, 0), ("F", 0, 0)]], 1),  # made later on its rank
                           ([[("F", 1, 0)], [("I", 0, 0), ("F", 0, 0)]], 2),
                           ([[("FB", ("F", 0, 0), ("B", 0, 0))]], 1)]:  # made by itself
        with pytest.raises(ValueError, match="deadlocks"):
            _reference(orders, stages)
        with pytest.raises(ValueError, match="deadlocks"):
            compile_dag(orders, stages)


def test_an_action_run_twice_is_rejected() -> None:
    with pytest.raises(ValueError, match="twice"):
        compile_dag([[("F", 0, 0), ("F", 0, 0)]], 1)
