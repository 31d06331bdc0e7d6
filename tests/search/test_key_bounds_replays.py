"""`replay_counts` (key_grid.py): the grid keeps the partial-recompute counts r up to the
largest layer count only, and the bounds are the same floats as over every r in 1..L."""

from __future__ import annotations

import numpy as np
import pytest
from test_key_bounds_batch import SPACES, _space

from autoparallel_cp.search import key_bounds as kb
from autoparallel_cp.search import key_grid as kg
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.tables import build_tables


def test_counts_stop_at_the_largest_layer_count() -> None:
    rs = np.arange(1, 62, dtype=float)
    assert kg.replay_counts(rs, np.array([15.0, 16.0])).tolist() == list(range(1, 17))
    assert kg.replay_counts(rs, np.array([61.0])).size == 61
    assert kg.replay_counts(rs, np.array([0.0])).tolist() == [1.0]
    # every dropped r replays what r = max(ls) replays, for each layer count
    ls = np.array([3.0, 7.0, 9.0])
    kept = kg.replay_counts(rs, ls)
    for r in rs[kept.size:]:
        assert (np.minimum(r, ls) == np.minimum(kept[-1], ls)).all()


@pytest.mark.parametrize("spec", SPACES[:1] + SPACES[4:5] + SPACES[6:])
def test_bounds_equal_over_every_count(spec: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    t = build_tables(_space(*spec))
    table = build_key_table(t)
    keys = [table.key(i) for i in range(min(len(table), 300))]
    got = kb.key_bounds(t, keys)
    monkeypatch.setattr(kg, "replay_counts", lambda rs, ls: rs)
    want = kb.key_bounds(t, keys)
    assert got == want
    assert any(np.isfinite(got))
