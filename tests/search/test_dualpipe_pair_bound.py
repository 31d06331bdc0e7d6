"""The master's DualPipe per-layer bound (search/model_scored.py `pair_harmonic`): a rank runs
its mirror pair on its own GPUs, so pairing sorted neighbours bounds the ranks' time; checked
by hand on two groups, against every pairing by brute force, and the per-stage memo of the
cost model (cost/memory.py `stage_memo`) against fresh computations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_replay_free_multi import _mixed_job

from autoparallel_cp.cost import memory
from autoparallel_cp.cost.steptime import stage_times
from autoparallel_cp.search.model_scored import pair_harmonic
from autoparallel_cp.spec.plan import Plan


def _brute(counts: list[int], u: list[float], L: float = 1.0) -> float:
    """min over rank pairings and pair layer counts (real, summing to L) of the slowest rank
    time T: pair i on groups (a, b) takes s_i·max(u_a, u_b)/2, so the least T is
    L/(2·Σ_i 1/max(u_a, u_b)), and the bound is the least over the pairings."""
    ranks = [g for g, c in enumerate(counts) for _ in range(c)]
    best = np.inf
    for perm in set(itertools.permutations(ranks)):
        p = len(perm)
        x = sum(1.0 / max(u[perm[r]], u[perm[p - 1 - r]]) for r in range(p // 2))
        best = min(best, L / (2.0 * x))
    return float(best)


def test_two_equal_groups_by_hand() -> None:
    """H100 layer 1, A100 layer 3, half the GPUs each: at pp 2 one rank runs every layer on
    the A100 (T = L·3/2, Hd = p·T/L = 3); at pp 4 the H100 pair takes 3/4 of the layers,
    T = L·3/8 (Hd = 3/2, the harmonic mean); the old bound (the fastest half) was 1."""
    u = [np.array(1.0), np.array(3.0)]
    assert float(pair_harmonic([0.5, 0.5], u, [2])) == pytest.approx(3.0)
    assert float(pair_harmonic([0.5, 0.5], u, [4])) == pytest.approx(1.5)
    assert float(pair_harmonic([0.5, 0.5], u, [2, 4, 8])) == pytest.approx(1.5)
    assert float(pair_harmonic([0.5, 0.5], u)) == pytest.approx(1.0)  # no pp: the old one
    # a pp where a group holds no whole count of stages: the old bound at that pp
    assert float(pair_harmonic([0.25, 0.75], u, [2])) == pytest.approx(
        1.0 / (2 * (0.25 / 1.0 + 0.25 / 3.0)))


@pytest.mark.parametrize("counts", [[1, 1], [1, 3], [3, 1], [2, 2], [2, 4], [1, 1, 2],
                                    [2, 1, 1], [3, 3, 2]])
def test_the_bound_is_the_best_pairing(counts: list[int]) -> None:
    """Hd·L/p equals the least T over every pairing of the ranks (brute force), for
    whichever group is fastest (elementwise over two orders of the per-layer times)."""
    p = sum(counts)
    fr = [c / p for c in counts]
    for times in itertools.permutations([1.0, 2.0, 5.0][:len(counts)]):
        u = [np.array(t) for t in times]
        hd = float(pair_harmonic(fr, u, [p]))
        assert hd / p == pytest.approx(_brute(counts, list(times)))
    # elementwise: an array of two orders at once
    u2 = [np.array([1.0, 4.0]), np.array([4.0, 1.0])] + [np.array([2.0, 2.0])] * (
        len(counts) - 2)
    got = pair_harmonic(fr, u2, [p])
    for e in range(2):
        assert got[e] / p == pytest.approx(_brute(counts, [float(x[e]) for x in u2]))


def test_the_stage_memo_gives_fresh_results() -> None:
    """Plans that differ only in their split share the cost model's per-stage memo; each
    result equals the one computed with every cache cleared."""
    job = _mixed_job(8)
    base = Plan(dp=1, tp=4, pp=4, mbs=2, num_microbatches=16, schedule="dualpipe",
                stage_groups=(0, 1, 1, 0))
    splits = [(1, 1, 2, 4), (2, 2, 2, 2), (1, 2, 1, 4), (4, 2, 1, 1)]

    def both(s: tuple[int, ...]) -> tuple[list[float], list[float]]:
        plan = base.model_copy(update={"stage_layers": s})
        return ([x.total_s for x in stage_times(job, plan)],
                [x.charged_bytes for x in memory.stage_memory(job, plan)])

    warm = [both(s) for s in splits]
    for s, w in zip(splits, warm, strict=True):
        memory.clear_factor_cache()
        assert both(s) == w
