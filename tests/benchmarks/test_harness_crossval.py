"""Leave-one-source-out (harness.crossval.loso): each source is left out exactly once, fitted on
the others only, and predicted from its own fold's grid point. Synthetic cases: the prediction
tables are made up so that each source pulls the fit to a known grid point."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from harness import crossval as X
from harness.tuned import TUNED

NAMES = list(TUNED)
SHAPE = tuple(len(TUNED[n][1]) for n in NAMES)


def _case(source: str, i: int, knobs: tuple[str, ...] = tuple(NAMES)) -> X.Case:
    none: Any = None
    return X.Case(("heldout", i), source, "heldout", f"{source}-{i}", 8, (1,), none, none, none,
                  100.0, knobs)


def _table(cases: list[X.Case], best: dict[str, tuple[int, ...]]
           ) -> dict[tuple[str, int], np.ndarray]:
    """Each case's predictions: exact (100) at its source's `best` grid point, 1% off per grid
    step elsewhere, so a fold's fit lands where most of its training rows agree."""
    grid = np.indices(SHAPE)
    out = {}
    for c in cases:
        dist = sum(np.abs(grid[a] - best[c.source][a]) for a in range(len(NAMES)))
        out[c.key] = 100.0 * (1 + 0.01 * dist)
    return out


def test_each_source_left_out_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [_case(s, 10 * k + j) for k, s in enumerate("abc") for j in range(3)]
    table = _table(cases, {s: (0,) * len(NAMES) for s in "abc"})
    seen: list[frozenset[str]] = []
    fit = X._fit

    def spy(train: list[X.Case], tab: dict) -> tuple[int, ...]:
        seen.append(frozenset(c.source for c in train))
        return fit(train, tab)

    monkeypatch.setattr(X, "_fit", spy)
    preds, fitted = X.loso(cases, table)
    assert seen == [frozenset("bc"), frozenset("ac"), frozenset("ab")]  # sources in order
    assert sorted(fitted) == ["a", "b", "c"]
    assert set(preds) == {c.key for c in cases}


def test_a_fold_never_sees_its_own_source() -> None:
    """Sources a and b (one row each) sit at one corner of the grid, c (five rows) at the
    opposite one, so any fit that sees c lands on c's corner. c's fold must fit a/b's corner and
    predict c off from there; a's and b's folds see c and land on its corner."""
    lo = (0,) * len(NAMES)
    hi = tuple(n - 1 for n in SHAPE)
    cases = [_case("a", 1), _case("b", 2)] + [_case("c", 10 + j) for j in range(5)]
    table = _table(cases, {"a": lo, "b": lo, "c": hi})
    preds, fitted = X.loso(cases, table)
    assert fitted["c"] == {n: TUNED[n][1][0] for n in NAMES}
    assert fitted["a"] == fitted["b"] == {n: TUNED[n][1][-1] for n in NAMES}
    for c in cases:
        assert preds[c.key] == pytest.approx(float(table[c.key][lo if c.source == "c" else hi]))
        assert preds[c.key] > 100.0  # every source predicted from the others' corner


def test_rows_without_tuned_constants_take_their_only_prediction() -> None:
    cases = [_case("a", 1), _case("b", 2, knobs=())]
    table = _table(cases, {"a": (0,) * len(NAMES), "b": (0,) * len(NAMES)})
    table[("heldout", 2)] = np.full(SHAPE, 123.0)
    preds, _ = X.loso(cases, table)
    assert preds[("heldout", 2)] == 123.0
