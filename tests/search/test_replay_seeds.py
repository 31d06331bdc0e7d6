"""search/cpsat_replay.py's seeds (`_seed_counts`: the p paths with each rank in turn the
slowest, replayed together by cost/path_batch.py and counted per rank with numpy) are
`_path_counts` of each seed, one by one, on ZBV and DualPipeV DAGs and several splits."""

from __future__ import annotations

import pytest

from autoparallel_cp.search import cpsat_replay as cr


@pytest.mark.parametrize("sched,p,m", [("zbv", 2, 4), ("zbv", 4, 16), ("zbv", 8, 32),
                                       ("dualpipev", 2, 6), ("dualpipev", 4, 9),
                                       ("dualpipev", 8, 40), ("zbv", 12, 48)])
@pytest.mark.parametrize("split", [(1.0, 1.0, 1.0), (0.3, 0.45, 0.25), (0.25, 0.5, 0.0)])
def test_the_seeds_are_the_single_paths(sched: str, p: int, m: int,
                                        split: tuple[float, float, float]) -> None:
    got = cr._seed_counts(sched, p, m, split)
    want = tuple(cr._path_counts(sched, p, m, split,
                                 tuple(1.25 if j == r else 1.0 for j in range(p)))
                 for r in range(p))
    assert got == want
    assert all(sum(map(sum, c)) > 0 for c in got)


def test_a_negative_share_takes_the_single_path() -> None:
    split = (0.5, -0.25, 0.75)
    assert cr._seed_counts("zbv", 4, 8, split) == tuple(
        cr._path_counts("zbv", 4, 8, split, tuple(1.25 if j == r else 1.0 for j in range(4)))
        for r in range(4))
