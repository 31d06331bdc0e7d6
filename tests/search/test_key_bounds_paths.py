"""`key_bounds` and the coupled `key_bound` take entry-saving numpy paths on large grids
(`key_grid.SPLIT_ENTRIES` / `SPLIT_POSITIONS`: the stage-time grid composed per (first, last)
class of positions, the caps found by argmax / argmin, the Lagrangian one multiplier at a time)
and one numpy call per step on small ones. Both paths must give the same floats: here every key
of the spaces of test_key_bounds_batch is bounded with each path forced, compared exactly."""

from __future__ import annotations

import pytest
from test_key_bounds_batch import SPACES, _space

from autoparallel_cp.search import key_bounds as kb
from autoparallel_cp.search import key_grid as kg
from autoparallel_cp.search.key_table import build_key_table
from autoparallel_cp.search.tables import build_tables


@pytest.mark.parametrize("cluster,moe,layers,seq,fix,partial,uniform", SPACES)
def test_both_paths_same_floats(monkeypatch: pytest.MonkeyPatch, cluster: str, moe: bool,
                                layers: int, seq: int, fix: str | None, partial: bool,
                                uniform: bool) -> None:
    t = build_tables(_space(cluster, moe, layers, seq, fix, partial, uniform))
    table = build_key_table(t)
    keys = [table.key(i) for i in range(len(table))]
    sample = keys[::max(1, len(keys) // 12)]

    def bounds(entries: int, positions: int) -> tuple[list[float], list[float]]:
        monkeypatch.setattr(kg, "SPLIT_ENTRIES", entries)
        monkeypatch.setattr(kg, "SPLIT_POSITIONS", positions)
        return kb.key_bounds(t, keys), [kb.key_bound(t, k, coupled=True) for k in sample]

    small = bounds(10**15, 10**6)
    split = bounds(0, 0)
    assert split == small  # floats compared exactly (inf == inf)
    assert any(v != float("inf") for v in small[0])
